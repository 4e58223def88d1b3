"""The address the RM hands its AMs (ELASTANE_RM_ADDRESS) and names in its ready file: cluster.toml's
rm_address (the address every process is configured with), or rm.toml's explicit advertise_host --
never the bind address or a host name that may resolve to loopback."""
from __future__ import annotations

import aiohttp
import pytest

from protocol import container_env
from protocol.config import ClusterConfig, RMConfig
from rm.__main__ import ready_info
from rm.server import ResourceManagerServer, client_url
from rm_testing import SECRET, register, submit


def _cluster(rm_address: str) -> ClusterConfig:
    return ClusterConfig(secret=SECRET, rm_address=rm_address)


@pytest.mark.parametrize("cfg, rm_address, port, expected", [
    # cluster.toml names this RM: used as written (a trailing slash dropped).
    (RMConfig(host="0.0.0.0", port=8088), "http://rm-1.example:8088/", 8088, "http://rm-1.example:8088"),
    (RMConfig(host="0.0.0.0", port=8088), "rm-1.example:8088", 8088, "http://rm-1.example:8088"),
    (RMConfig(host="0.0.0.0", port=8088), "https://rm-1.example:8088", 8088, "https://rm-1.example:8088"),
    # --port 0: cluster.toml's host with the port the RM really serves on.
    (RMConfig(host="0.0.0.0", port=0), "http://10.0.0.5:8088", 41234, "http://10.0.0.5:41234"),
    (RMConfig(host="::", port=0), "http://[fd00::5]:8088", 41234, "http://[fd00::5]:41234"),
    # an explicit advertise_host is the RM's own choice (a local cluster's bridge address).
    (RMConfig(host="0.0.0.0", port=0, advertise_host="10.200.0.1"), "http://127.0.0.1:8088", 41234,
     "http://10.200.0.1:41234"),
    (RMConfig(host="127.0.0.1", port=0), "http://127.0.0.1:0", 5000, "http://127.0.0.1:5000"),
])
def test_client_url(cfg: RMConfig, rm_address: str, port: int, expected: str) -> None:
    assert client_url(cfg, _cluster(rm_address), port) == expected


def test_ready_file_names_the_client_address() -> None:
    info = ready_info("http://rm-1.example:8088")
    assert info["url"] == "http://rm-1.example:8088" and info["http_address"] == "rm-1.example:8088"


async def test_an_rm_bound_to_all_interfaces_gives_its_ams_the_cluster_rm_address(tmp_path) -> None:
    cfg = RMConfig(host="0.0.0.0", port=0, state_dir=str(tmp_path / "state"))
    # 127.0.0.2: a loopback address other than the bind or a host name's, reachable here.
    server = ResourceManagerServer(cfg, _cluster("http://127.0.0.2:8088"), run_timers=False)
    url = await server.start()
    try:
        assert url == f"http://127.0.0.2:{server.port}"
        register(server.core, "n1:1")
        submit(server.core)
        (eff,) = server.core.take_effects()
        assert server.launcher is not None
        env = server.launcher.launch_context(eff).environment
        assert env[container_env.RM_ADDRESS] == url
        async with aiohttp.ClientSession() as http, http.get(url + "/ws/v1/cluster/info") as r:
            assert (await r.json())["clusterInfo"]["state"] == "STARTED"
    finally:
        await server.stop()
