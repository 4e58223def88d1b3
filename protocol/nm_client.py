"""Client of an NM's container API, used by the RM (to launch AMs) and by AMs (to launch containers)."""
from __future__ import annotations

from . import codec, internal_api as api
from .http_client import JsonHttpClient
from .json_types import JsonInObject
from .records import Resource


class NMClient:
    """Start / stop / query containers on NMs; one keep-alive client per NM address."""

    def __init__(self, timeout_s: float = 30.0):
        self._clients: dict[str, JsonHttpClient] = {}
        self._timeout_s = timeout_s

    def _client(self, http_address: str) -> JsonHttpClient:
        c = self._clients.get(http_address)
        if c is None:
            base = http_address if http_address.startswith("http") else f"http://{http_address}"
            c = self._clients[http_address] = JsonHttpClient(base, timeout_s=self._timeout_s)
        return c

    async def start_container(self, http_address: str, container_token: str,
                              launch_context: api.LaunchContext) -> api.ContainerStatus:
        req = api.StartContainerRequest(container_token=container_token, launch_context=launch_context)
        out = await self._client(http_address).post(api.CONTAINER_START, req, token=container_token)
        return codec.decode_as(out, api.ContainerStatus)

    async def stop_container(self, http_address: str, container_id: str,
                             container_token: str) -> api.ContainerStatus:
        out = await self._client(http_address).post(api.container_stop_path(container_id), {},
                                                    token=container_token)
        return codec.decode_as(out, api.ContainerStatus)

    async def container_status(self, http_address: str, container_id: str,
                               container_token: str) -> api.ContainerStatus:
        out = await self._client(http_address).get(api.container_status_path(container_id),
                                                   token=container_token)
        return codec.decode_as(out, api.ContainerStatus)

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()
        self._clients.clear()


def container_token_payload(container_id: str, node_id: str, app_id: str, attempt_id: str, user: str,
                            resource: Resource) -> JsonInObject:
    """The claims of a container token: who may launch what, where, with which resource."""
    return {
        "container_id": container_id,
        "node_id": node_id,
        "app_id": app_id,
        "attempt_id": attempt_id,
        "user": user,
        "resource": resource.to_json(),
    }
