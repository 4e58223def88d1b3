"""End to end on a real localhost cluster (RM + 3 NMs as processes): the distributed shell's
lifecycle — success, failure, kill (and who may kill), AM attempts, and the YARN REST flow."""
from pathlib import Path

import aiohttp
import pytest

from appmaster.distributed_shell import build_submission
from conftest import FINAL_STATES, RestError, get_app, pid_alive, pids_with_env, rest, submit_app, wait_app
from polling import async_wait_until, wait_until
from protocol import container_env

pytestmark = pytest.mark.cluster


def app_processes_gone(app_id: str) -> bool:
    return not pids_with_env(container_env.APP_ID, app_id)


def container_stdouts(cluster, app_id: str) -> dict[str, str]:
    out = {}
    for n in cluster.nodes:
        for f in (Path(n.log_dir) / app_id).glob("*/stdout"):
            out[f.parent.name] = f.read_text()
    return out


def test_distributed_shell_runs_to_succeeded(cluster, tmp_path):
    # The containers wait for a gate file (the NMs run on this host), so the app stays RUNNING
    # until the test has seen that state, however slow the host.
    release = tmp_path / "release"
    cmd = f"while [ ! -e {release} ]; do sleep 0.05; done; echo hello-from-$CONTAINER_ID"
    sub = build_submission("hello", ["sh", "-c", cmd], 2, 128, 1)
    app_id = submit_app(cluster.rm_url, sub, user="alice")
    running = wait_app(cluster.rm_url, app_id, ("RUNNING",), 60)
    assert running["user"] == "alice" and running["finalStatus"] == "UNDEFINED"
    release.touch()
    app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 60)
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    assert app["applicationType"].upper() == "DISTRIBUTED_SHELL" and app["name"] == "hello"
    greetings = {cid: text for cid, text in container_stdouts(cluster, app_id).items() if "hello-from" in text}
    assert len(greetings) == 2
    for cid, text in greetings.items():
        assert text.strip() == f"hello-from-{cid}"
    wait_until(lambda: app_processes_gone(app_id), 30, "every process of the app gone")


def test_failing_command_finishes_failed_naming_the_containers(cluster):
    sub = build_submission("fails", ["sh", "-c", "exit 3"], 2, 128, 1)
    app_id = submit_app(cluster.rm_url, sub)
    app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 60)
    assert app["finalStatus"] == "FAILED"
    assert app["diagnostics"].count("exited with 3") == 2, app["diagnostics"]
    assert f"container_{app_id.removeprefix('application_')}_01_" in app["diagnostics"]


def test_kill_needs_the_owner_and_leaves_no_process(cluster, tmp_path):
    cmd = ["sh", "-c", f"echo $$ > {tmp_path}/$CONTAINER_ID.pid; exec sleep 300"]
    app_id = submit_app(cluster.rm_url, build_submission("sleeper", cmd, 2, 128, 1), user="alice")
    try:
        wait_app(cluster.rm_url, app_id, ("RUNNING",), 60)
        files = wait_until(lambda: (fs := list(tmp_path.glob("*.pid"))) and len(fs) == 2 and
                           all(f.read_text().strip() for f in fs) and fs, 60, "both containers running")
        pids = [int(f.read_text()) for f in files]
        assert all(pid_alive(p) for p in pids)

        with pytest.raises(RestError) as e:
            rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="mallory")
        assert e.value.status == 403
        assert "RemoteException" in e.value.body
        assert get_app(cluster.rm_url, app_id)["state"] == "RUNNING"
        assert all(pid_alive(p) for p in pids), "a refused kill must change nothing"

        rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        app = wait_app(cluster.rm_url, app_id, ("KILLED",), 30)
        assert app["finalStatus"] == "KILLED"
        assert rest(cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}/state") == {"state": "KILLED"}
        wait_until(lambda: not any(pid_alive(p) for p in pids) and app_processes_gone(app_id), 30,
                   "the AM and both containers gone")
    finally:
        _kill_quietly(cluster, app_id)


def test_am_exiting_without_unregistering_is_retried_then_failed(cluster):
    sub = build_submission("no-unregister", ["true"], 1, 128, 1, max_app_attempts=2)
    sub["am-container-spec"]["commands"]["command"] = "exit 7"
    app_id = submit_app(cluster.rm_url, sub)
    app = wait_app(cluster.rm_url, app_id, ("FAILED",), 60)
    assert app["finalStatus"] == "FAILED"
    attempts = rest(cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}/appattempts")["appAttempts"]["appAttempt"]
    assert len(attempts) == 2, attempts
    assert sorted(int(a["id"]) for a in attempts) == [1, 2]


async def test_yarn_rest_flow_as_a_yarn_tool_does_it(cluster):
    url = cluster.rm_url + "/ws/v1/cluster"
    async with aiohttp.ClientSession(headers={"Accept": "application/json"}) as s:
        async with s.get(url + "/info") as r:
            assert r.status == 200 and (await r.json())["clusterInfo"]["state"] == "STARTED"
        async with s.post(url + "/apps/new-application", params={"user.name": "bob"}) as r:
            assert r.status == 200
            new = await r.json()
        app_id = new["application-id"]
        assert app_id.startswith("application_") and new["maximum-resource-capability"]["memory"] > 0
        body = {
            "application-id": app_id,
            "application-name": "from-a-yarn-tool",
            "application-type": "DISTRIBUTED_SHELL",
            "queue": "default",
            "priority": 0,
            "am-container-spec": {
                "commands": {"command": "python -m appmaster.distributed_shell --num-containers 2 "
                                        "--container-memory 128 --container-vcores 1 -- echo hi"},
                "environment": {"entry": [{"key": "PYTHONUNBUFFERED", "value": "1"}]},
            },
            "unmanaged-AM": False,
            "max-app-attempts": 1,
            "resource": {"memory": 128, "vCores": 1},
            "keep-containers-across-application-attempts": False,
        }
        async with s.post(url + "/apps", params={"user.name": "bob"}, json=body) as r:
            assert r.status == 202, await r.text()
        async def final_state() -> str | None:      # poll the state endpoint like a YARN client
            async with s.get(f"{url}/apps/{app_id}/state") as r:
                state = (await r.json())["state"]
            return state if state in FINAL_STATES else None
        state = await async_wait_until(final_state, 60, f"{app_id} in a final state", interval_s=0.1)
        assert state == "FINISHED"
        async with s.get(f"{url}/apps/{app_id}") as r:
            app = (await r.json())["app"]
        assert app["finalStatus"] == "SUCCEEDED" and app["user"] == "bob" and app["name"] == "from-a-yarn-tool"
        async with s.get(url + "/apps", params={"states": "FINISHED", "user": "bob"}) as r:
            listed = (await r.json())["apps"]["app"]
        assert app_id in [a["id"] for a in listed] and all(a["user"] == "bob" for a in listed)
        async with s.get(f"{url}/apps/{app_id}/appattempts") as r:
            attempts = (await r.json())["appAttempts"]["appAttempt"]
        assert len(attempts) == 1
    greetings = [t for t in container_stdouts(cluster, app_id).values() if t.strip() == "hi"]
    assert len(greetings) == 2


def _kill_quietly(cluster, app_id: str) -> None:
    try:
        if get_app(cluster.rm_url, app_id)["state"] not in ("FINISHED", "FAILED", "KILLED"):
            rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
            wait_app(cluster.rm_url, app_id, ("KILLED",), 30)
    except Exception:
        pass
