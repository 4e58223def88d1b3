"""EPS's global decision making (EPS §3.1.3, §3.2, §3.3): which model blocks and which input
splits move where when servers or workers join or leave. Pure functions, no I/O.

The AM holds what every executor has (model blocks per server, active and inactive input splits
per worker) and decides round-robin, so that neither parameters nor data end up irregularly
distributed:

- joining (`balance_onto`): repeatedly the most loaded current holder gives one item (its highest
  numbered) to the least loaded newcomer, until no current holder has more than one item above
  any newcomer. Items leave their holders round-robin, as P3 and P5 leave S2 and S3 in EPS Fig. 6.
- leaving (`drain`): each item of a leaving holder goes to the least loaded remaining holder, in
  order (round-robin over equally loaded holders). For input splits there is first EPS's check:
  a remaining worker whose *inactive* dataset already holds the split takes it back by
  re-activating its copy instead of receiving it again (EPS Fig. 11).

Ties are broken by the order of the holders given (the AM passes them by executor index), so a
decision is deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence
from protocol.errors import PlanningError
from protocol.ps_status import EpsTransfer


class DecisionError(PlanningError, ValueError):
    """A decision that cannot be made (nobody to move to, an unknown holder ...)."""


@dataclass(frozen=True)
class Transfer:
    """Move `item` (a model block or an input split) from `src` to `dst`.

    `reactivate`: the destination already holds the item in its inactive dataset, so only the
    item's mutable state travels (input splits only).
    """

    item: int
    src: str
    dst: str
    reactivate: bool = False

    def record(self, kind: str) -> EpsTransfer:
        """The move as an EPS operation's record shows it (`kind`: "block" or "split")."""
        return EpsTransfer(kind=kind, item=self.item, src=self.src, dst=self.dst, reactivate=self.reactivate)


def _loads(holdings: Mapping[str, Sequence[int]], names: Sequence[str]) -> dict[str, list[int]]:
    return {n: sorted(holdings.get(n, ())) for n in names}


def balance_onto(holdings: Mapping[str, Sequence[int]], current: Sequence[str],
                 newcomers: Sequence[str]) -> list[Transfer]:
    """Transfers that give `newcomers` (holding nothing yet) a balanced share of the items of
    `current` holders. Every item stays where it is unless it has to move."""
    if not newcomers:
        return []
    if not current:
        raise DecisionError("no current holders to take items from")
    clash = sorted(set(current) & set(newcomers))
    if clash:
        raise DecisionError(f"{clash} are both current holders and newcomers")
    have = _loads(holdings, current)
    new: dict[str, list[int]] = {n: [] for n in newcomers}
    order = {n: i for i, n in enumerate(list(current) + list(newcomers))}
    out: list[Transfer] = []
    while True:
        donor = max(current, key=lambda n: (len(have[n]), -order[n]))
        taker = min(newcomers, key=lambda n: (len(new[n]), order[n]))
        if len(have[donor]) <= len(new[taker]) + 1:
            return out
        item = have[donor].pop()
        new[taker].append(item)
        out.append(Transfer(item, donor, taker))


def drain(holdings: Mapping[str, Sequence[int]], leaving: Sequence[str], remaining: Sequence[str],
          inactive: Mapping[str, Sequence[int]] | None = None) -> list[Transfer]:
    """Transfers that empty the `leaving` holders onto the `remaining` ones.

    With `inactive` (worker -> splits held in its inactive dataset) a split goes back to a
    remaining worker that still has it, as a re-activation; the rest go round-robin to the least
    loaded remaining holders."""
    if not leaving:
        return []
    if not remaining:
        raise DecisionError("nobody would remain to take the items of " + ", ".join(leaving))
    clash = sorted(set(leaving) & set(remaining))
    if clash:
        raise DecisionError(f"{clash} are both leaving and remaining")
    have = _loads(holdings, remaining)
    order = {n: i for i, n in enumerate(remaining)}
    spare = {n: set((inactive or {}).get(n, ())) for n in remaining}
    todo = [(item, src) for src in leaving for item in sorted(holdings.get(src, ()))]
    out: list[Transfer] = []
    rest: list[tuple[int, str]] = []
    for item, src in todo:
        # EPS's check: scan the remaining workers for an inactive copy of the split.
        owners = [n for n in remaining if item in spare[n]]
        if owners:
            dst = min(owners, key=lambda n: (len(have[n]), order[n]))
            spare[dst].discard(item)
            have[dst].append(item)
            out.append(Transfer(item, src, dst, reactivate=True))
        else:
            rest.append((item, src))
    for item, src in rest:
        dst = min(remaining, key=lambda n: (len(have[n]), order[n]))
        have[dst].append(item)
        out.append(Transfer(item, src, dst))
    return out


def pick_leaving(candidates: Sequence[str], n: int) -> list[str]:
    """The `n` holders to remove: the most recently added first (the end of `candidates`), so a
    worker removed after an add finds its splits' inactive copies on the workers that sent them."""
    if n < 0 or n > len(candidates):
        raise DecisionError(f"cannot pick {n} of {len(candidates)}")
    return list(candidates[len(candidates) - n:])


def pick_leaving_off(candidates: Sequence[tuple[str, str]], n: int, allowed: Sequence[str]) -> list[str]:
    """The `n` holders to remove when the job may keep executors only on the `allowed` nodes
    (a directive's placement): `(holder, node)` pairs; those on other nodes first (they would have
    to move anyway), then `pick_leaving` among the rest. Empty `allowed`: `pick_leaving`."""
    if not allowed:
        return pick_leaving([h for h, _ in candidates], n)
    keep = set(allowed)
    away = [h for h, node in candidates if node not in keep]
    on = [h for h, node in candidates if node in keep]
    if n <= len(away):
        return pick_leaving(away, n)
    return away + pick_leaving(on, n - len(away))


def placement_moves(candidates: Sequence[tuple[str, str]], wanted: Mapping[str, int]
                    ) -> tuple[list[str], dict[str, int]]:
    """What brings one role's executors to a per-node placement (a directive's `NodePlacement`s:
    exactly `wanted[node]` on each node, none elsewhere): `(holder, node)` pairs in launch order ->
    (the holders to remove, how many to add on each node). Surplus on a node leaves most recent
    first (`pick_leaving`); a node short of its count gets the difference. A node set alone cannot
    say this: two workers on one host and two servers on another are "on the group's nodes" but
    not one worker + one server on each (Harmony's layout, §4.3.2)."""
    if any(n < 0 for n in wanted.values()):
        raise DecisionError(f"negative count in placement {dict(wanted)}")
    on: dict[str, list[str]] = {}
    for holder, node in candidates:
        on.setdefault(node, []).append(holder)
    leaving: list[str] = []
    for node, holders in on.items():
        surplus = len(holders) - wanted.get(node, 0)
        if surplus > 0:
            leaving += pick_leaving(holders, surplus)
    adds = {node: n - len(on.get(node, [])) for node, n in wanted.items() if n > len(on.get(node, []))}
    return leaving, adds


def group_by_route(transfers: Sequence[Transfer]) -> dict[tuple[str, str], list[int]]:
    """Items per (src, dst) pair, in order: one migration or one send per pair."""
    out: dict[tuple[str, str], list[int]] = {}
    for t in transfers:
        out.setdefault((t.src, t.dst), []).append(t.item)
    return out


def holdings_after(holdings: Mapping[str, Sequence[int]], transfers: Sequence[Transfer]) -> dict[str, list[int]]:
    """Who holds what once `transfers` are done (to check a decision or report it)."""
    out = {k: sorted(v) for k, v in holdings.items()}
    for t in transfers:
        if t.item not in out.get(t.src, []):
            raise DecisionError(f"{t.src} does not hold {t.item}")
        out[t.src].remove(t.item)
        out.setdefault(t.dst, []).append(t.item)
    return {k: sorted(v) for k, v in out.items()}
