"""ExecutorRecovery's bookkeeping without a cluster: which losses a job survives, how losses that
arrive together count, when it gives up and with what diagnostics."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from appmaster.ps.executor_pool import Role
from appmaster.ps.job import JobPhase
from appmaster.ps.recovery import ExecutorRecovery
from protocol.ps_job_spec import validate
from psruntime.apps.registry import create_app


def recovery(spec_json: dict[str, Any], phase: JobPhase = JobPhase.TRAINING, checkpoint: bool = True) -> ExecutorRecovery:
    spec = validate({"workers": 2, "servers": 2, **spec_json})
    app = create_app(spec.app, spec.app_data(), spec.app_hparams())
    steps = SimpleNamespace(training=None, checkpointer=SimpleNamespace(last={"dir": "d"} if checkpoint else None))
    return ExecutorRecovery(spec, app, steps, lambda: phase, on_record=lambda r: None)  # type: ignore[arg-type]


def test_losses_within_the_limit_are_recovered_and_one_event_counts_once() -> None:
    r = recovery({"app": "mlr", "max_executor_failures": 2})
    assert r.enabled and r.why_not() is None
    assert r.on_lost("server-0 (server, c2 on n1) exited with -100 (ABORTED)") is None
    assert r.on_lost("worker-1 (worker, c5 on n1) exited with -100 (ABORTED)") is None   # same node, same event
    assert r.failures == 1 and len(r.pending) == 2 and len(r.losses) == 2
    r.pending.clear()                                     # recovered
    assert r.on_lost("worker-0 (worker, c9 on n2) exited with 137") is None
    assert r.failures == 2
    r.pending.clear()
    fatal = r.on_lost("server-3 (server, c11 on n3) exited with 1")
    assert fatal is not None and "gave up after 3 executor failures (max_executor_failures 2)" in fatal
    assert fatal.endswith("server-3 (server, c11 on n3) exited with 1") and r.failures == 2


def test_jobs_that_cannot_recover_fail_at_the_first_loss_with_its_description() -> None:
    text = "worker-1 (worker, c5 on n1) exited with -104 (KILLED_EXCEEDED_PMEM)"
    for r in (recovery({"app": "mlr", "max_executor_failures": 0}),
              recovery({"app": "mlr"}, phase=JobPhase.INITIALISING), recovery({"app": "mlr"}, checkpoint=False)):
        assert r.on_lost(text) == text and r.pending == [] and r.failures == 0, r.why_not()
    assert not recovery({"app": "nmf", "max_executor_failures": 0}).enabled and recovery({"app": "lasso"}).enabled


def test_apps_with_worker_state_go_back_to_the_checkpoint_even_for_a_lost_worker() -> None:
    """NMF's user factors and LDA's assignments of a lost worker exist only in the checkpoint."""
    worker = SimpleNamespace(executor_id="worker-1", role=Role("worker"))
    for app in ("nmf", "lda"):
        r = recovery({"app": app})
        assert r.enabled and r.on_lost("worker-1 (worker, c5 on n1) exited with 137", worker) is None  # type: ignore[arg-type]
        assert r.rollback_needed, app


def test_lost_workers_alone_are_replaced_anything_else_goes_back_to_the_checkpoint() -> None:
    worker, server = (SimpleNamespace(executor_id=f"{r}-1", role=Role(r)) for r in ("worker", "server"))
    r = recovery({"app": "mlr"})
    assert r.on_lost("worker-1 (worker, c5 on n1) exited with -100 (ABORTED)", worker) is None  # type: ignore[arg-type]
    assert r.pending and not r.rollback_needed
    assert r.on_lost("server-1 (server, c2 on n1) exited with -100 (ABORTED)", server) is None  # type: ignore[arg-type]
    assert r.rollback_needed and r.failures == 1          # one event, and now with a server in it
    ssp = recovery({"app": "mlr", "sync": "ssp"})
    ssp.on_lost("worker-1 (worker, c5 on n1) exited with 137", worker)  # type: ignore[arg-type]
    assert ssp.rollback_needed                            # a clock is redone only under BSP
    unknown = recovery({"app": "mlr"})
    unknown.on_lost("worker-1 (worker, c5 on n1) exited with 137")
    assert unknown.rollback_needed


def test_a_lost_worker_that_held_no_splits_counts_but_leaves_nothing_to_replace() -> None:
    r = recovery({"app": "mlr"})
    r.training = SimpleNamespace(membership=SimpleNamespace(worker_ids=lambda: ["worker-0", "worker-1"]))
    joining = SimpleNamespace(executor_id="worker-2", role=Role.WORKER)     # an EPS addition, not committed
    assert r.on_lost("worker-2 (worker, c7 on n2) exited with 137", joining) is None  # type: ignore[arg-type]
    assert r.failures == 1 and r.pending == [] and not r.rollback_needed


async def test_a_recovery_waits_for_the_running_change_to_end() -> None:
    """A change that a loss makes fail ends (rolled back by its own steps) before anything is
    replaced: the recovery's hold on the change slot comes after it, never beside it."""
    import asyncio

    from appmaster.ps.reconfiguration import ChangeBusy, Reconfiguration

    training = SimpleNamespace(rpc=None, pool=None, loop=SimpleNamespace(boundaries=None))
    steps = Reconfiguration(None, training, None, None, set(), started=lambda: True)  # type: ignore[arg-type]
    order: list[str] = []
    change_may_end = asyncio.Event()

    async def change() -> None:
        async with steps.exclusive("add_workers(1)"):
            order.append("change starts")
            await change_may_end.wait()
            order.append("change ends")

    async def recovery() -> None:
        async with steps.exclusive_when_free("recovery"):
            order.append("recovery")

    running = asyncio.ensure_future(change())
    await asyncio.sleep(0)
    waiting = asyncio.ensure_future(recovery())
    for _ in range(20):
        await asyncio.sleep(0)
    assert order == ["change starts"] and steps.current == "add_workers(1)"
    try:
        async with steps.exclusive("another change"):
            raise AssertionError("a second change may not start meanwhile")
    except ChangeBusy:
        pass
    change_may_end.set()
    await asyncio.gather(running, waiting)
    assert order == ["change starts", "change ends", "recovery"] and not steps.busy
