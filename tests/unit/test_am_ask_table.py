"""The AM's ask table: absolute counts, decrement on grants, zero rows sent once then dropped."""
import pytest

from appmaster.ask_table import AskError, AskTable
from protocol.internal_api import AllocatedContainer
from protocol.records import Resource

R = Resource(256, 1)


def grant(ask_id: int, n: int = 1) -> AllocatedContainer:
    return AllocatedContainer(container_id=f"c{n}", node_id="n:1", node_http_address="n:1", resource=R,
                              container_token="t", ask_id=ask_id)


def test_add_assigns_ids_and_counts_outstanding():
    t = AskTable()
    a = t.add(3, R, tag="worker")
    b = t.add(2, Resource(512, 2), priority=1)
    assert a != b
    assert t.outstanding(a) == 3 and t.outstanding(b) == 2 and t.outstanding() == 5
    assert t.pending
    sent = {x.ask_id: x for x in t.to_send()}
    assert sent[a].count == 3 and sent[a].tag == "worker" and sent[b].priority == 1


def test_grants_decrement_and_surplus_is_reported():
    t = AskTable()
    a = t.add(2, R)
    assert t.on_allocated(grant(a))
    assert t.on_allocated(grant(a))
    assert t.outstanding(a) == 0 and not t.pending
    assert not t.on_allocated(grant(a)), "a third container for a row of two is surplus"
    assert not t.on_allocated(grant(77)), "a container for an unknown ask is surplus"


def test_live_rows_always_sent_zero_rows_sent_once():
    t = AskTable()
    a = t.add(1, R)
    first = t.to_send()
    t.acknowledge(first)
    assert [x.count for x in t.to_send()] == [1], "a live row is sent on every heartbeat"
    t.cancel(a)
    zero = t.to_send()
    assert [(x.ask_id, x.count) for x in zero] == [(a, 0)]
    t.acknowledge(zero)
    assert t.to_send() == [] and t.rows() == []


def test_zero_row_not_dropped_when_changed_after_sending():
    t = AskTable()
    a = t.add(2, R)
    t.set_count(a, 0)
    sent = t.to_send()
    t.set_count(a, 4)               # changed while the request was in flight
    t.acknowledge(sent)
    assert [x.count for x in t.to_send()] == [4]


def test_fully_granted_row_is_dropped_without_a_zero_update():
    t = AskTable()
    a = t.add(1, R)
    t.acknowledge(t.to_send())
    t.on_allocated(grant(a))        # the RM's copy went to zero when it granted
    assert t.to_send() == []
    t.acknowledge([])
    assert t.rows() == [] or all(r.count == 0 for r in t.rows())


def test_resync_resends_a_cancelled_row():
    t = AskTable()
    a = t.add(2, R)
    t.cancel(a)
    t.mark_all_dirty()
    assert [(x.ask_id, x.count) for x in t.to_send()] == [(a, 0)]


@pytest.mark.parametrize("count,res", [(0, R), (-1, R), (1, Resource(0, 1)), (1, Resource(64, 0)),
                                        (1, Resource(-5, 1))])
def test_bad_asks_rejected(count, res):
    t = AskTable()
    with pytest.raises(AskError):
        t.add(count, res)
    assert t.rows() == []


def test_set_count_errors():
    t = AskTable()
    with pytest.raises(AskError, match="unknown ask_id"):
        t.set_count(5, 1)
    a = t.add(1, R)
    with pytest.raises(AskError, match=">= 0"):
        t.set_count(a, -1)
    assert t.outstanding(a) == 1
