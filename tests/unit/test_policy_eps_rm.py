"""`--policy eps` inside a ResourceManager (in-process, fake clock): an incoming PS job makes the
running one shrink, the directive reaches its AM's allocate response once, and the released
containers go to the waiting job."""
from __future__ import annotations

import msgspec
import pytest

from protocol import codec
from protocol import internal_api as api
from protocol.job_report import MAX_OBJECTIVES, JobReport
from protocol.records import Resource
from rm.__main__ import load_configs, parse_args
from rm.model import AmSpec
from rm.policies import EpsPolicy
from rm.policy_runner import run_policy
from rm.server import ResourceManagerServer
from rm_testing import FakeClock, ask, heartbeat, launch_and_register, make_core, ps_spec, register

E = Resource(1024, 1)


def submit_ps(core, workers: int, servers: int, name: str) -> str:
    app_id = core.new_application()
    spec = {"app": "mlr", "workers": workers, "servers": servers, "executor_memory_mb": 1024, "executor_vcores": 1}
    core.submit(app_id, "alice", name, "default", "ELASTANE_PS", AmSpec(["true"], {}, {}, Resource(1024, 1)),
                1, ps_job=ps_spec(spec))
    core.app_saved(app_id)
    return app_id


def shape(workers: int, servers: int) -> JobReport:
    return JobReport(workers=workers, servers=servers, started=True, iterations=150, early_feedback=True,
                              early_feedback_iterations=100, speed=1.0, speed_iterations=50,
                              executor_resource=E)


async def test_eps_directive_reaches_the_running_jobs_am_and_frees_room_for_the_incoming_job(tmp_path):
    (tmp_path / "cluster.toml").write_text('[cluster]\nsecret = "test-secret-0123456789"\n')
    cfg, cluster = load_configs(parse_args(["--policy", "eps", "--state-dir", str(tmp_path / "rm"),
                                            "--cluster-config", str(tmp_path / "cluster.toml")]))
    rm = ResourceManagerServer(cfg, cluster, clock=FakeClock(), run_timers=False)
    core = rm.core
    try:
        assert isinstance(rm.policy, EpsPolicy)
        register(core, "n1:1", mem=6 * 1024, vcores=6)

        # Job A: AM + 3 workers + 2 servers fill the node; it has passed its early feedback.
        a = submit_ps(core, 3, 2, "A")
        claims = launch_and_register(core, a)
        r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 3, tag="worker"),
                                                                           ask(2, 2, tag="server")]))
        granted = {c.tag: [x.container_id for x in r.allocated if x.tag == c.tag] for c in r.allocated}
        assert len(granted["worker"]) == 3 and len(granted["server"]) == 2
        r = core.allocate(claims, api.AllocateRequest(response_id=r.response_id, shape=shape(3, 2)))
        assert run_policy(core, rm.policy) == 0            # full cluster, nobody waiting: nothing to do

        # Job B (AM + 1 worker + 1 server) arrives: nothing is free, so A must give up 3 executors.
        b = submit_ps(core, 1, 1, "B")
        assert core.apps[b].state.value == "ACCEPTED" and core.scheduler.apps[b].am_request is not None
        assert run_policy(core, rm.policy) == 1
        r = core.allocate(claims, api.AllocateRequest(response_id=r.response_id, shape=shape(3, 2)))
        d = r.shape_directive
        assert d is not None and (d.workers, d.servers, d.version) == (1, 1, 1) and b in d.reason
        # Delivered once; the next tick does not ask again while A is shrinking.
        assert run_policy(core, rm.policy) == 0
        r = core.allocate(claims, api.AllocateRequest(response_id=r.response_id, shape=msgspec.structs.replace(
            shape(3, 2), changing=True)))
        assert r.shape_directive is None

        # A's AM obeys: it releases two workers and a server; once the NM reports them gone,
        # B's AM gets its container.
        release = granted["worker"][:2] + granted["server"][:1]
        r = core.allocate(claims, api.AllocateRequest(response_id=r.response_id, releases=release,
                                                      shape=shape(1, 1)))
        assert core.scheduler.apps[b].am_request is not None
        heartbeat(core, "n1:1", [api.ContainerStatus(container_id=cid, state="COMPLETE", exit_status=-105)
                                 for cid in release])
        assert core.scheduler.apps[b].am_request is None
        assert any(c.app_id == b and c.is_am for c in core.containers.values())
        assert run_policy(core, rm.policy) == 0
        assert r.shape_directive is None
        shape_view = rm.core.apps[a].directive
        assert shape_view is not None and (shape_view.workers, shape_view.servers) == (1, 1)
    finally:
        rm.store.close()


def test_a_bad_job_report_is_refused_at_decode_naming_the_field():
    # The report is typed on the wire: the RM refuses a bad one when it decodes the request (a 400
    # naming the field, before the core sees it; tests/unit/test_rm_api.py checks it over HTTP).
    with pytest.raises(codec.DecodeError, match=r"\$\.shape\.workers"):
        codec.decode_as(codec.dumps({"response_id": 0, "shape": {"workers": -2, "servers": 1}}), api.AllocateRequest)
    with pytest.raises(codec.DecodeError, match=r"\$\.shape\.objectives"):
        codec.decode_as(codec.dumps({"response_id": 0, "shape": {"workers": 1, "servers": 1, "objectives": [
            {"epoch": i, "objective": 1.0} for i in range(MAX_OBJECTIVES + 1)]}}), api.AllocateRequest)
    core = make_core(policy="eps")
    register(core, "n1:1")
    a = submit_ps(core, 1, 1, "A")
    claims = launch_and_register(core, a)
    req = codec.decode_as(codec.dumps({"response_id": 0, "shape": {"workers": 1, "servers": 1, "epoch": 2}}),
                          api.AllocateRequest)
    ok = core.allocate(claims, req)
    assert ok.response_id == 1 and core.apps[a].shape == JobReport(workers=1, servers=1, epoch=2)
