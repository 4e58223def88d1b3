"""An in-process RM (no timers, fake clock) behind an HTTP test client, for the web UI page tests."""
from __future__ import annotations

from typing import Any, AsyncIterator, Optional

from aiohttp.test_utils import TestClient, TestServer

from protocol.config import ClusterConfig, RMConfig
from protocol.ps_job_spec import PSJobSpec
from protocol.records import Resource
from rm.model import AmSpec
from rm.server import ResourceManagerServer
from rm_testing import SECRET, FakeClock, register


class PageEnv:
    """The RM, its test client and its clock."""

    def __init__(self, rm: ResourceManagerServer, client: TestClient, clock: FakeClock):
        self.rm, self.client, self.clock = rm, client, clock

    def submit(self, name: str = "job", app_type: str = "YARN", user: str = "alice",
               ps_job: Optional[PSJobSpec] = None) -> str:
        core = self.rm.core
        app_id = core.new_application()
        core.submit(app_id, user, name, "default", app_type, AmSpec(["true"], {}, {}, Resource(1024, 1)),
                    2, ps_job=ps_job)
        core.app_saved(app_id)
        return app_id

    async def get(self, path: str, status: int = 200) -> str:
        resp = await self.client.get(path)
        text = await resp.text()
        assert resp.status == status, f"GET {path}: {resp.status} {text}"
        assert resp.content_type == "text/html"
        return text

    async def get_json(self, path: str) -> Any:
        resp = await self.client.get(path)
        assert resp.status == 200, f"GET {path}: {resp.status}"
        return await resp.json()


async def page_env_of(tmp_path: Any, utilization: Optional[dict[str, Any]] = None) -> AsyncIterator[PageEnv]:
    """A PageEnv with node n1:1 registered; `utilization` (when given) is what the RM's
    /ws/v1/cluster/utilization answers, as if the NMs had reported those series."""
    clock = FakeClock()
    rm = ResourceManagerServer(RMConfig(state_dir=str(tmp_path / "state")),
                               ClusterConfig(secret=SECRET, admins=["root"]), clock=clock, run_timers=False)
    register(rm.core, "n1:1")
    if utilization is not None:
        # The RM's own endpoint serves these canned series (as if NMs had reported them).
        rm.core.utilization.to_json = lambda since_ms=None, node_id=None: utilization  # type: ignore[method-assign]
    app = rm.build_app()
    client = TestClient(TestServer(app))
    await client.start_server()
    yield PageEnv(rm, client, clock)
    await rm.stop()
    await client.close()
