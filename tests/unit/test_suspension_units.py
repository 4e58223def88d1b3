"""Pause / resume of a PS job: the pure transition table and how directives' run states drive it.

The I/O of a pause (cut, checkpoint, release) and of a resume (start, restore) is checked on a
real cluster in tests/cluster/test_pause_resume_cluster.py."""
from __future__ import annotations

import asyncio
import json
from typing import Any, Sequence

import pytest

from appmaster.ps.directives import DirectiveHandler, DirectiveOutcome, Shape
from appmaster.ps.suspension import TRANSITIONS, SuspendEvent, SuspendState
from elastane_cli.ps_reports import colocation_text
from protocol import codec
from protocol.internal_api import NodePlacement, RunState, ShapeDirective
from protocol.ps_status import PsStatus, decode_status
from protocol.records import Resource
from protocol.remote_exception import Conflict


def test_a_job_pauses_only_while_running_and_resumes_only_while_paused() -> None:
    S, E = SuspendState, SuspendEvent
    assert TRANSITIONS.next(S.RUNNING, E.PAUSE) is S.PAUSING
    assert TRANSITIONS.next(S.PAUSING, E.STOPPED) is S.PAUSED
    assert TRANSITIONS.next(S.PAUSED, E.RESUME) is S.RESUMING
    assert TRANSITIONS.next(S.RESUMING, E.RESUMED) is S.RUNNING
    # converged before the boundary: back to running; a failed resume stays paused (the cut is kept)
    assert TRANSITIONS.next(S.PAUSING, E.FAILED) is S.RUNNING
    assert TRANSITIONS.next(S.RESUMING, E.FAILED) is S.PAUSED
    for state, event in [(S.RUNNING, E.RESUME), (S.PAUSED, E.PAUSE), (S.PAUSING, E.PAUSE),
                         (S.RESUMING, E.PAUSE), (S.RUNNING, E.STOPPED)]:
        with pytest.raises(Conflict, match=state.value.lower()):
            TRANSITIONS.next(state, event)


class FakeSuspender:
    """Records pause / resume calls; a pause holds until `stopped` is set (the clock boundary)."""

    def __init__(self) -> None:
        self.paused = False
        self.calls: list[tuple[object, ...]] = []
        self.stopped = asyncio.Event()
        self.stopped.set()

    async def pause(self) -> None:
        self.calls.append(("pause",))
        self.paused = True
        await self.stopped.wait()

    async def resume(self, workers: int, servers: int, placement: Sequence[NodePlacement] = (),
                     nodes: Sequence[str] = (), resource: Resource | None = None) -> None:
        self.calls.append(("resume", workers, servers, tuple(placement), tuple(nodes)) +
                          ((resource,) if resource is not None else ()))
        self.paused = False


class FakeReshaper:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, tuple[str, ...]]] = []

    async def reshape(self, target: Shape, nodes: tuple[str, ...], placement: Sequence[NodePlacement] = ()) -> None:
        self.calls.append((target.workers, target.servers, nodes))


def directive(version: int, workers: int, servers: int, run_state: RunState = RunState.RUN,
              placement: Sequence[NodePlacement] = (), resource: Resource | None = None) -> ShapeDirective:
    return ShapeDirective(workers=workers, servers=servers, version=version, run_state=run_state,
                          placement=list(placement), nodes=[p.node for p in placement], executor_resource=resource)


async def test_run_states_pause_and_resume_through_the_suspender_not_the_reshaper() -> None:
    sus, reshaper = FakeSuspender(), FakeReshaper()
    changes: list[bool] = []
    h = DirectiveHandler(lambda: reshaper, lambda: Shape(2, 2), on_change=changes.append, suspender=sus)
    h.training_started()

    h.on_directive(directive(1, 2, 2, RunState.PAUSE))
    await h.wait_idle(5)
    assert sus.calls == [("pause",)] and sus.paused and reshaper.calls == []

    h.on_directive(directive(2, 2, 2, RunState.PAUSE))       # already paused: nothing happens
    await h.wait_idle(5)
    assert sus.calls == [("pause",)]

    placement = (NodePlacement(node="n1", workers=2, servers=1), NodePlacement(node="n2", workers=1, servers=0))
    h.on_directive(directive(3, 3, 1, RunState.RESUME, placement, Resource(256, 1)))
    await h.wait_idle(5)
    assert sus.calls[-1] == ("resume", 3, 1, placement, ("n1", "n2"), Resource(256, 1)) and not sus.paused
    assert reshaper.calls == [] and changes == [True, False, True, False]
    assert [o.steps for o in h.history] == [[("pause", 1)], [], [("resume", 1)]]
    assert all(o.error == "" for o in h.history)

    h.on_directive(directive(4, 3, 2))                        # running again: a plain reshape
    await h.wait_idle(5)
    assert reshaper.calls == [(3, 2, ())]


async def test_a_resume_while_the_pause_waits_for_its_boundary_is_applied_after_it() -> None:
    sus, reshaper = FakeSuspender(), FakeReshaper()
    sus.stopped.clear()
    h = DirectiveHandler(lambda: reshaper, lambda: Shape(1, 1), suspender=sus)
    h.training_started()
    h.on_directive(directive(1, 1, 1, RunState.PAUSE))
    h.on_directive(directive(2, 2, 1, RunState.RUN))          # the policy changed its mind meanwhile
    await asyncio.sleep(0)
    assert sus.calls == [("pause",)] and h.busy
    sus.stopped.set()
    await h.wait_idle(5)
    assert sus.calls == [("pause",), ("resume", 2, 1, (), ())]


async def test_a_failed_pause_is_recorded_and_later_directives_still_run() -> None:
    class Refusing(FakeSuspender):
        async def pause(self) -> None:
            raise Conflict("the job finished training before it could pause")

    sus, reshaper = Refusing(), FakeReshaper()
    h = DirectiveHandler(lambda: reshaper, lambda: Shape(2, 2), suspender=sus)
    h.training_started()
    h.on_directive(directive(1, 2, 2, RunState.PAUSE))
    await h.wait_idle(5)
    assert "finished training" in h.history[0].error and not sus.paused
    h.on_directive(directive(2, 3, 2))
    await h.wait_idle(5)
    assert reshaper.calls == [(3, 2, ())]


def test_ps_status_shows_the_group_the_pause_and_the_spill() -> None:
    def as_served(status: dict[str, Any]) -> PsStatus:       # through JSON, as /status serves it
        return decode_status(json.loads(codec.dumps(status)))
    assert colocation_text(as_served({})) is None
    assert colocation_text(as_served({"suspension": {"state": "RUNNING", "pauses": 0}})) is None
    outcomes = [DirectiveOutcome(1, Shape(2, 1), Shape(2, 1), [], 100.0),
                DirectiveOutcome(2, Shape(0, 0), Shape(2, 1), [("pause", 1)], 110.0, seconds=1.0, group="g2",
                                 run_state="pause")]
    status = {"directives": [o.record() for o in outcomes],
              "suspension": {"state": "PAUSED", "pauses": 1, "paused_s": 12.0},
              "spill": {"alpha": 0.25, "spilled_mb": 31.46}}
    text = colocation_text(as_served(status))
    assert text is not None and text.startswith("group g2; paused, 1 pause (")
    assert text.endswith("spill alpha 0.25, 31.5 MB on disk")


async def test_a_new_executor_size_moves_the_job_by_restarting_it_from_a_cut() -> None:
    sus, reshaper = FakeSuspender(), FakeReshaper()
    size = [Resource(512, 1)]
    h = DirectiveHandler(lambda: reshaper, lambda: Shape(1, 1), suspender=sus, executor_resource=lambda: size[0],
                         placed=lambda nodes, placement: False)     # its executors are elsewhere
    h.training_started()
    placement = (NodePlacement(node="n2", workers=1, servers=1),)
    h.on_directive(directive(1, 1, 1, placement=placement, resource=Resource(512, 1)))   # same size: live
    await h.wait_idle(5)
    assert reshaper.calls == [(1, 1, ("n2",))] and sus.calls == []
    h.on_directive(directive(2, 1, 1, placement=placement, resource=Resource(384, 1)))   # another size
    await h.wait_idle(5)
    assert sus.calls == [("pause",), ("resume", 1, 1, placement, ("n2",), Resource(384, 1))]
    assert h.history[-1].steps == [("pause", 1), ("resume", 1)] and reshaper.calls == [(1, 1, ("n2",))]


async def test_a_resume_that_got_no_executors_is_tried_again_while_the_job_stays_paused(monkeypatch) -> None:
    from appmaster.ps import directives as directives_module
    from appmaster.ps.reconfiguration import LaunchFailed
    monkeypatch.setattr(directives_module, "RESUME_RETRY_S", 0.0)

    class Refusing(FakeSuspender):
        refusals = 2

        async def resume(self, *args: object, **kw: object) -> None:
            if self.refusals:
                self.refusals -= 1
                self.calls.append(("refused",))
                raise LaunchFailed("the new workers did not start: 0 of 1 new workers ready after 120s")
            await super().resume(*args, **kw)  # type: ignore[arg-type]

    sus, reshaper = Refusing(), FakeReshaper()
    h = DirectiveHandler(lambda: reshaper, lambda: Shape(1, 1), suspender=sus)
    h.training_started()
    h.on_directive(directive(1, 1, 1, RunState.PAUSE))
    h.on_directive(directive(2, 1, 1, RunState.RESUME))
    await h.wait_idle(5)
    assert [c[0] for c in sus.calls] == ["pause", "refused", "refused", "resume"] and not sus.paused
    assert h.history[-1].error == ""
