"""Gang admission (rm/scheduler.py, RMConfig.gang_admission): a PS job's AM container starts only
when the AM and its minimum executor set fit together, in the queue's headroom and on the nodes."""
from __future__ import annotations

import pytest

from protocol import config as config_mod
from protocol import internal_api as api
from protocol.config import QueueConfig
from protocol.job_report import JobReport
from protocol.records import ZERO, Resource
from protocol.remote_exception import BadRequest
from rm.model import AmSpec
from rm_testing import am_claims, ask, heartbeat, make_core, ps_spec, register, submit

AM = Resource(1024, 1)
EXEC = Resource(1024, 1)


def submit_ps(core, workers: int = 2, servers: int = 1, min_workers: int = 2, min_servers: int = 1,
              user: str = "alice", queue: str = "default", **spec) -> str:
    app_id = core.new_application()
    core.submit(app_id, user, "ps", queue, "ELASTANE_PS", AmSpec(["true"], {}, {}, AM), 1,
                ps_job=ps_spec({"app": "mlr", "workers": workers, "servers": servers, "min_workers": min_workers,
                                "min_servers": min_servers, "executor_memory_mb": EXEC.memory,
                                "executor_vcores": EXEC.vcores, **spec}))
    core.app_saved(app_id)
    return app_id


def has_am(core, app_id: str) -> bool:
    return any(c.is_am and c.app_id == app_id for c in core.containers.values())


def test_the_am_waits_until_it_and_the_minimum_executors_fit_then_starts() -> None:
    core = make_core(gang_shape="minimum")
    register(core, "n1:1", mem=8192, vcores=3)       # AM + 3 executors need 4 vcores
    app = submit_ps(core)
    heartbeat(core, "n1:1")
    assert not has_am(core, app) and core.scheduler.apps[app].used == ZERO      # holds nothing
    assert core.scheduler.apps[app].gang_waiting
    assert "waiting for its gang" in core.apps[app].diagnostics and "3 x executor" in core.apps[app].diagnostics
    register(core, "n2:1", mem=8192, vcores=1)       # the gang now fits across the two nodes
    heartbeat(core, "n1:1")
    assert has_am(core, app) and not core.scheduler.apps[app].gang_waiting
    assert core.apps[app].diagnostics == ""


def test_without_gang_admission_the_am_starts_on_whatever_room_there_is() -> None:
    core = make_core(gang_admission=False)
    register(core, "n1:1", mem=8192, vcores=3)
    app = submit_ps(core)
    assert has_am(core, app) and core.scheduler.apps[app].gang is None


def test_the_submitted_gang_shape_waits_for_the_whole_submitted_job() -> None:
    core = make_core(gang_shape="submitted")
    register(core, "n1:1", mem=16384, vcores=4)
    app = submit_ps(core, workers=4, servers=2, min_workers=1, min_servers=1)   # AM + 6 do not fit
    assert not has_am(core, app)
    minimum = make_core(gang_shape="minimum")
    register(minimum, "n1:1", mem=16384, vcores=4)
    assert has_am(minimum, submit_ps(minimum, workers=4, servers=2, min_workers=1, min_servers=1))


def test_an_admitted_gang_is_held_against_the_next_admission_until_its_executors_are_allocated() -> None:
    core = make_core()
    register(core, "n1:1", mem=16384, vcores=8)
    first = submit_ps(core)                  # AM + 3: admitted, 3 executors reserved
    second = submit_ps(core)                 # 8 - 1 - 3 reserved = 4 = AM + 3: admitted
    third = submit_ps(core)                  # nothing left for it
    assert has_am(core, first) and has_am(core, second) and not has_am(core, third)
    assert core.scheduler.apps[first].gang_reserved == 3
    # An app without a gang is not held back by the reservations (they guard admissions only).
    yarn = submit(core, user="bob", mem=1024, vcores=1)
    assert has_am(core, yarn)
    # The first job gets its executors: its reservation is spent.
    claims = am_claims(core, first)
    for eff in core.take_effects():
        core.am_launched(eff.attempt_id)
    core.am_register(claims, api.AmRegisterRequest(tracking_url="http://am:1"))
    core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 3, mem=EXEC.memory, vcores=EXEC.vcores)]))
    assert core.scheduler.apps[first].gang_reserved == 0


@pytest.mark.parametrize("how", ["started", "paused"])
def test_a_gang_reservation_ends_once_the_job_trains_or_a_policy_shapes_it(how: str) -> None:
    """The first job's AM asks for one executor only -- it trains with it (its report says started),
    or a policy's directive pauses it -- so the rest of its gang is never asked for: the room held
    for it goes back, and the next AM whose gang fits the free room starts, where it waited for as
    long as the first attempt lived."""
    core = make_core()
    register(core, "n1:1", mem=16384, vcores=8)
    first = submit_ps(core)                   # AM + 3 executors: admitted, 3 reserved
    claims = am_claims(core, first)
    for eff in core.take_effects():
        core.am_launched(eff.attempt_id)
    core.am_register(claims, api.AmRegisterRequest(tracking_url="http://am:1"))
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1, mem=EXEC.memory, vcores=EXEC.vcores)]))
    assert core.scheduler.apps[first].gang_reserved == 2
    later = submit_ps(core, workers=4, min_workers=4)     # AM + 5: exactly the 6 vcores free
    assert not has_am(core, later)
    if how == "started":
        core.allocate(claims, api.AllocateRequest(response_id=r.response_id, shape=JobReport(
            workers=1, servers=0, started=True, executor_resource=EXEC)))
    else:       # a pause may carry its group's counts: it asks for nothing all the same
        core.apps[first].directive = api.ShapeDirective(version=1, workers=2, servers=1, reason="paused",
                                                        run_state=api.RunState.PAUSE)
        core.apps[first].directive_version = 1
        core.allocate(claims, api.AllocateRequest(response_id=r.response_id))
    assert core.scheduler.apps[first].gang_reserved == 0
    heartbeat(core, "n1:1")
    assert has_am(core, later)


def test_a_finished_attempt_gives_its_reservation_back() -> None:
    core = make_core()
    register(core, "n1:1", mem=16384, vcores=8)
    first = submit_ps(core)
    second = submit_ps(core)
    waiting = submit_ps(core)
    assert not has_am(core, waiting)
    core.kill(first)                          # its AM and its reserved gang go
    heartbeat(core, "n1:1")                   # the NM is told to clean the AM up ...
    heartbeat(core, "n1:1")                   # ... and no longer reports it: its room is free
    assert has_am(core, waiting) and has_am(core, second)


def test_the_gang_must_fit_the_queue_headroom_too() -> None:
    core = make_core(queues=[QueueConfig(name="small", capacity=50.0, max_capacity=50.0),
                             QueueConfig(name="other", capacity=50.0, max_capacity=100.0)])
    register(core, "n1:1", mem=16384, vcores=6)      # the small queue may use 3 vcores: AM + 3 > 3
    app = submit_ps(core, queue="small")
    assert not has_am(core, app)
    fits = submit_ps(core, queue="other")
    assert has_am(core, fits)


def test_a_ps_job_whose_executor_exceeds_the_maximum_allocation_is_refused_and_not_stored() -> None:
    core = make_core(maximum_allocation_vcores=4)
    app_id = core.new_application()
    with pytest.raises(BadRequest, match="elastane.ps-job.executor resource"):
        core.submit(app_id, "alice", "ps", "default", "ELASTANE_PS", AmSpec(["true"], {}, {}, AM), 1,
                    ps_job=ps_spec({"app": "mlr", "executor_vcores": 8}))
    assert app_id not in core.apps and app_id in core.reserved_ids


def test_a_bad_gang_shape_in_rm_toml_is_a_config_error_naming_it(tmp_path) -> None:
    path = tmp_path / "rm.toml"
    path.write_text('[rm]\ngang_shape = "everything"\n')
    with pytest.raises(config_mod.ConfigError, match="gang_shape"):
        config_mod.load_rm(str(path))
    path.write_text("[rm]\ngang_admission = false\n")
    assert config_mod.load_rm(str(path)).gang_admission is False
