"""EPS's pure parts: round-robin transmission decisions (model blocks and input splits) and the
two-dataset bookkeeping (active / inactive splits), including the re-activation of a split whose
inactive copy a remaining worker still holds."""
from __future__ import annotations

import itertools

import pytest

from appmaster.ps.eps_datasets import LedgerError, SplitLedger
from appmaster.ps.eps_decisions import (DecisionError, Transfer, balance_onto, drain, group_by_route,
                                        holdings_after, pick_leaving, pick_leaving_off, placement_moves)


def counts(h: dict[str, list[int]]) -> dict[str, int]:
    return {k: len(v) for k, v in h.items()}


def test_add_server_takes_blocks_round_robin_from_the_most_loaded() -> None:
    # EPS Fig. 6's job: S4 joins three servers; it takes blocks round-robin from the most loaded
    # until no server has more than one block above it (here one move already balances 6 over 4).
    h = {"s1": [0, 3], "s2": [1, 4], "s3": [2, 5]}
    assert balance_onto(h, ["s1", "s2", "s3"], ["s4"]) == [Transfer(3, "s1", "s4")]
    h = {"s1": [0, 3, 6], "s2": [1, 4, 7], "s3": [2, 5, 8]}
    moves = balance_onto(h, ["s1", "s2", "s3"], ["s4"])
    assert moves == [Transfer(6, "s1", "s4"), Transfer(7, "s2", "s4")]
    assert counts(holdings_after(h, moves)) == {"s1": 2, "s2": 2, "s3": 3, "s4": 2}


@pytest.mark.parametrize("blocks,current,new", list(itertools.product([5, 8, 13, 16], [1, 2, 3], [1, 2, 3])))
def test_balance_onto_balances_and_moves_only_what_it_must(blocks: int, current: int, new: int) -> None:
    names = [f"s{i}" for i in range(current)]
    newcomers = [f"n{i}" for i in range(new)]
    h = {n: [b for b in range(blocks) if b % current == i] for i, n in enumerate(names)}
    moves = balance_onto(h, names, newcomers)
    after = holdings_after(h, moves)
    sizes = [len(after.get(n, [])) for n in names + newcomers]
    assert max(sizes) - min(sizes) <= 1
    assert sorted(b for v in after.values() for b in v) == list(range(blocks))   # nothing lost or doubled
    assert all(t.dst in newcomers and t.src in names for t in moves)              # only onto newcomers
    # The fewest moves that balance: what the newcomers end with.
    assert len(moves) == sum(len(after.get(n, [])) for n in newcomers)


def test_remove_server_spreads_its_blocks_round_robin() -> None:
    # EPS Fig. 12: S3's partitions P5, P6 go to S1 and S2.
    h = {"s1": [0, 1], "s2": [2, 3], "s3": [4, 5]}
    moves = drain(h, ["s3"], ["s1", "s2"])
    assert moves == [Transfer(4, "s3", "s1"), Transfer(5, "s3", "s2")]
    assert group_by_route(moves) == {("s3", "s1"): [4], ("s3", "s2"): [5]}


def test_drain_prefers_the_least_loaded_and_ends_balanced() -> None:
    h = {"a": [0, 1, 2], "b": [3], "c": [4, 5, 6, 7]}
    moves = drain(h, ["c"], ["a", "b"])
    after = holdings_after(h, moves)
    assert counts(after) == {"a": 4, "b": 4, "c": 0}


def test_remove_worker_reactivates_inactive_copies_instead_of_resending() -> None:
    # EPS Fig. 8 then 11: W4 got D3, D6, D9 from W1..W3, which kept them inactive; removing W4
    # sends nothing: each split is re-activated where its copy is.
    h = {"w1": [1, 2], "w2": [4, 5], "w3": [7, 8], "w4": [3, 6, 9]}
    inactive = {"w1": [3], "w2": [6], "w3": [9]}
    moves = drain(h, ["w4"], ["w1", "w2", "w3"], inactive)
    assert sorted(moves, key=lambda t: t.item) == [Transfer(3, "w4", "w1", True), Transfer(6, "w4", "w2", True),
                                                   Transfer(9, "w4", "w3", True)]


def test_drain_resends_what_no_inactive_copy_covers() -> None:
    h = {"w1": [0], "w2": [1], "w3": [2, 3, 4]}
    moves = drain(h, ["w3"], ["w1", "w2"], {"w1": [4]})
    assert Transfer(4, "w3", "w1", True) in moves
    plain = [t for t in moves if not t.reactivate]
    assert sorted(t.item for t in plain) == [2, 3] and {t.dst for t in plain} == {"w1", "w2"}


def test_impossible_decisions_are_refused() -> None:
    with pytest.raises(DecisionError, match="nobody would remain"):
        drain({"a": [0]}, ["a"], [])
    with pytest.raises(DecisionError, match="both leaving and remaining"):
        drain({"a": [0]}, ["a"], ["a"])
    with pytest.raises(DecisionError, match="no current holders"):
        balance_onto({}, [], ["n"])
    with pytest.raises(DecisionError, match="cannot pick"):
        pick_leaving(["a"], 2)
    with pytest.raises(DecisionError, match="does not hold"):
        holdings_after({"a": [0]}, [Transfer(1, "a", "b")])


def test_pick_leaving_takes_the_most_recent() -> None:
    assert pick_leaving(["w0", "w1", "w2", "w3"], 2) == ["w2", "w3"]
    assert pick_leaving(["w0"], 0) == []


def test_pick_leaving_off_removes_executors_off_the_allowed_nodes_first() -> None:
    held = [("w0", "n1"), ("w1", "n2"), ("w2", "n1"), ("w3", "n3")]
    assert pick_leaving_off(held, 1, ["n1"]) == ["w3"]
    assert pick_leaving_off(held, 2, ["n1"]) == ["w1", "w3"]
    assert pick_leaving_off(held, 3, ["n1"]) == ["w1", "w3", "w2"]
    assert pick_leaving_off(held, 2, []) == ["w2", "w3"]          # no placement: the most recent


def test_placement_moves_bring_one_role_to_exact_per_node_counts() -> None:
    # First fit put both workers on n1; the placement wants one on n1 and one on n2.
    assert placement_moves([("w0", "n1"), ("w1", "n1")], {"n1": 1, "n2": 1}) == (["w1"], {"n2": 1})
    # Already placed: nothing moves.
    assert placement_moves([("w0", "n1"), ("w1", "n2")], {"n1": 1, "n2": 1}) == ([], {})
    # Off the placement's nodes: leaves; a node at 0 counts as off it.
    assert placement_moves([("w0", "n3"), ("w1", "n1")], {"n1": 1, "n2": 1, "n3": 0}) == (["w0"], {"n2": 1})
    # A change of count too: growing adds, shrinking removes the most recent of a node's surplus.
    assert placement_moves([("w0", "n1")], {"n1": 2, "n2": 1}) == ([], {"n1": 1, "n2": 1})
    assert placement_moves([("w0", "n1"), ("w1", "n1"), ("w2", "n1")], {"n1": 1}) == (["w1", "w2"], {})


def test_placement_moves_refuse_a_negative_count() -> None:
    with pytest.raises(DecisionError, match="negative"):
        placement_moves([("w0", "n1")], {"n1": -1})


# ----- the two datasets ---------------------------------------------------------------------------

def test_ledger_add_then_remove_round_trip_uses_the_inactive_copies() -> None:
    led = SplitLedger()
    led.add_worker("w0", [0, 1, 2, 3])
    led.add_worker("w1", [4, 5, 6, 7])
    led.add_worker("w2")
    add = balance_onto(led.holdings(), ["w0", "w1"], ["w2"])
    for t in add:
        led.apply(t, keep_inactive=True)
    assert {len(v) for v in led.holdings().values()} <= {2, 3}
    sent = {t.item: t.src for t in add}
    assert {s for w in ("w0", "w1") for s in led.inactive_of(w)} == set(sent)
    back = drain(led.holdings(), ["w2"], ["w0", "w1"], led.inactive_holdings())
    assert all(t.reactivate and t.dst == sent[t.item] for t in back)   # each split home, nothing resent
    for t in back:
        led.apply(t, keep_inactive=False)
    led.remove_worker("w2")
    assert led.holdings() == {"w0": [0, 1, 2, 3], "w1": [4, 5, 6, 7]}
    assert led.inactive_holdings() == {"w0": [], "w1": []}


def test_ledger_refuses_inconsistent_changes_and_changes_nothing() -> None:
    led = SplitLedger()
    led.add_worker("a", [0, 1])
    led.add_worker("b", [2])
    with pytest.raises(LedgerError, match="already active"):
        led.add_worker("c", [1])
    with pytest.raises(LedgerError, match="split 0 is not active on a"):
        led.check([Transfer(0, "a", "b"), Transfer(0, "a", "b")])
    with pytest.raises(LedgerError, match="not in the inactive dataset"):
        led.apply(Transfer(0, "a", "b", reactivate=True), keep_inactive=False)
    with pytest.raises(LedgerError, match="still has active splits"):
        led.remove_worker("a")
    with pytest.raises(LedgerError, match="unknown worker"):
        led.apply(Transfer(0, "a", "zz"), keep_inactive=False)
    assert led.holdings() == {"a": [0, 1], "b": [2]} and led.inactive_holdings() == {"a": [], "b": []}
    assert led.holder_of(2) == "b" and led.holder_of(9) is None
