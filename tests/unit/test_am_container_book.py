"""The AM's container records and their pure state machine."""
import pytest

from appmaster.container_book import (TRANSITIONS, AmContainerState as S, ContainerBook, ContainerEvent as E,
                                      TransitionError, next_state)
from protocol.internal_api import AllocatedContainer, ContainerStatus
from protocol.records import ExitStatus, Resource


def alloc(cid: str = "container_1_0001_01_000002") -> AllocatedContainer:
    return AllocatedContainer(container_id=cid, node_id="h:1", node_http_address="h:1",
                              resource=Resource(128, 1), container_token="tok", ask_id=1, tag="shell")


def test_happy_path():
    assert next_state(S.ALLOCATED, E.LAUNCH) is S.LAUNCHING
    assert next_state(S.LAUNCHING, E.LAUNCHED) is S.RUNNING
    assert next_state(S.RUNNING, E.STOP) is S.STOPPING
    assert next_state(S.STOPPING, E.COMPLETE) is S.COMPLETED


def test_completed_is_final():
    for ev in E:
        with pytest.raises(TransitionError):
            next_state(S.COMPLETED, ev)
    assert all(src is not S.COMPLETED for src, _ in TRANSITIONS)


@pytest.mark.parametrize("state,event", [(S.ALLOCATED, E.LAUNCHED), (S.RUNNING, E.LAUNCH),
                                         (S.RUNNING, E.RELEASE), (S.ALLOCATED, E.LAUNCH_FAILED)])
def test_illegal_transitions(state, event):
    with pytest.raises(TransitionError, match=event.value):
        next_state(state, event)


def test_book_completes_once_and_ignores_unknown():
    book = ContainerBook()
    rec = book.add(alloc())
    assert rec.state is S.ALLOCATED and rec.tag == "shell" and rec.token == "tok"
    book.apply(rec.container_id, E.LAUNCH)
    book.apply(rec.container_id, E.LAUNCHED)
    st = ContainerStatus(container_id=rec.container_id, state="COMPLETE", exit_status=-104, diagnostics="oom")
    assert book.complete(st) is rec
    assert rec.done and rec.exit_status == -104 and rec.diagnostics == "oom"
    assert book.complete(st) is None, "a duplicate report is ignored"
    assert book.complete(ContainerStatus(container_id="container_9_9999_01_000001", state="COMPLETE")) is None
    assert book.live() == []


def test_book_rejects_double_allocation_and_unknown_events():
    book = ContainerBook()
    book.add(alloc())
    with pytest.raises(TransitionError, match="allocated twice"):
        book.add(alloc())
    with pytest.raises(TransitionError, match="unknown container"):
        book.apply("container_1_0001_01_000099", E.LAUNCH)


def test_finish_locally_on_failed_launch():
    book = ContainerBook()
    rec = book.add(alloc())
    book.apply(rec.container_id, E.LAUNCH)
    book.finish_locally(rec.container_id, E.LAUNCH_FAILED, ExitStatus.INVALID, "refused")
    assert rec.done and rec.exit_status == ExitStatus.INVALID and rec.diagnostics == "refused"


def test_describe_exit():
    book = ContainerBook()
    rec = book.add(alloc())
    rec.exit_status = -104
    assert rec.describe_exit() == "container_1_0001_01_000002 exited with -104 (KILLED_EXCEEDED_PMEM)"
    rec.exit_status = 3
    assert rec.describe_exit() == "container_1_0001_01_000002 exited with 3"
