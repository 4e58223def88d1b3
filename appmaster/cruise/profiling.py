"""Measured metrics -> the cost model's inputs (dissertation §3.2.2: inputs measured, not configured).

- C^i_w.proc: compute seconds per training instance, averaged per mini-batch (eq. 3.3's measure:
  gradient time divided by the instances processed).
- worker bandwidth: bytes exchanged per mini-batch / communication seconds per mini-batch. When the
  servers are the bottleneck this underestimates the worker's own bandwidth, which is the safe
  side: eq. 3.4 takes the max of both terms and the server term is measured separately.
- server bandwidth: bytes served per second the server was busy serving.

A slot without its own figure (a server never ran as worker, a container just granted) borrows them:
first from executors of the same node class (same hardware), then from all executors, compute scaled
by vcores (compute time per instance taken as inversely proportional to cores); bandwidths missing
on one side take the other side's.

A declared link rate (MetricsBook.record_link: the node's NIC speed or an emulated cap) is the
bandwidth both roles get when the link is the bottleneck. It replaces the worker's measured figure,
which is only a lower bound (a server-bound worker waits on the servers, and taking that wait as
its own bandwidth would make adding servers look useless), and caps the server's measured serving
rate, which counts CPU service and not transmission.

The measured figures describe the node under the current shape; `isolate_from_shape` takes the
shape's share out, so they can price any other shape (the cost model's departures 3 and 4):
- compute: measured while W workers compute at once, so divided by the contention k(W) of the
  hosts' cores (JobProfile.compute_parallelism);
- latency per mini-batch: what the worker's measured communication time per mini-batch leaves
  once even a fully serialised exchange -- its own link's term plus the slowest server's -- is
  taken out (never negative). Bandwidth queueing shows in the two terms, a round trip's fixed cost
  in neither; slots that measured none take the workers' mean.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from models.cruise_cost import Assignment, JobProfile, NodeProfile

from .metrics import LastKnown, MetricsBook
from protocol.errors import PlanningError


class ProfilingError(PlanningError, ValueError):
    """Not enough has been measured to price a configuration."""


@dataclass(frozen=True)
class SlotInfo:
    """A container slot as the RM describes it: id (executor id, or a free slot's id), hardware class."""

    slot_id: str
    node_class: str = "default"
    vcores: int = 1

    def __post_init__(self) -> None:
        if self.vcores < 1:
            raise ProfilingError(f"{self.slot_id}: vcores must be >= 1, got {self.vcores}")


def _borrow(slot: SlotInfo, slots: Sequence[SlotInfo], known: dict[str, LastKnown],
            get: Callable[[LastKnown], Optional[float]], scale_by_vcores: bool) -> Optional[float]:
    own = known.get(slot.slot_id)
    if own is not None and get(own) is not None:
        return get(own)
    same = [v for s in slots
            if s.node_class == slot.node_class and s.slot_id in known and (v := get(known[s.slot_id])) is not None]
    if same:
        return float(np.mean(same))
    pairs = [(v, s.vcores) for s in slots
             if s.slot_id in known and (v := get(known[s.slot_id])) is not None]
    if not pairs:
        return None
    if scale_by_vcores:
        return float(np.mean([v * cores for v, cores in pairs])) / slot.vcores
    return float(np.mean([v for v, _ in pairs]))


def derive_profiles(book: MetricsBook, slots: Sequence[SlotInfo]) -> list[NodeProfile]:
    """A NodeProfile for every slot, from what `book` measured (see the module doc)."""
    known = book.last_known
    out = []
    for s in slots:
        c = _borrow(s, slots, known, lambda k: k.compute_s_per_sample, True)
        bw = _borrow(s, slots, known, lambda k: k.worker_bandwidth, False)
        bs = _borrow(s, slots, known, lambda k: k.server_bandwidth, False)
        link = _borrow(s, slots, known, lambda k: k.link_bandwidth, False)
        if link is not None:
            bw, bs = link, min(bs, link) if bs is not None else link
        if c is None:
            raise ProfilingError("no worker has reported compute time yet")
        bw, bs = bw or bs, bs or bw
        if bw is None or bs is None:
            raise ProfilingError("no bandwidth measured yet (workers' bytes or servers' counters)")
        out.append(NodeProfile(s.slot_id, c, bw, bs))
    return out


def measured_bytes_per_batch(book: MetricsBook, nominal: float) -> float:
    """Bytes one worker moves each way per mini-batch: half the workers' mean pull + push if they
    report bytes (a push carries the keys its pull fetched), else `nominal` (the whole model, the
    dissertation's dense pull)."""
    vals = [w.bytes_per_batch.value for w in book.workers.values() if w.bytes_per_batch.value]
    return float(np.mean(vals)) / 2.0 if vals else nominal


def isolate_from_shape(profiles: Sequence[NodeProfile], job: JobProfile, current: Assignment,
                       book: MetricsBook) -> list[NodeProfile]:
    """`profiles` measured under the `current` shape, with that shape's share taken out (module doc)."""
    by_id = {p.node_id: p for p in profiles}
    contention = job.contention(len(current.workers)) if current.workers else 1.0
    latency: dict[str, float] = {}
    servers = [(by_id[j], m) for j, m in current.servers.items() if j in by_id]
    if servers and len(servers) == len(current.servers):
        w = len(current.workers)
        server_batch = max(m * job.bytes_per_model_block * w / p.server_bandwidth for p, m in servers)
        for i in current.workers:
            st = book.workers.get(i)
            if i in by_id and st is not None and st.comm_s.value is not None:
                exchange = job.bytes_per_batch / by_id[i].worker_bandwidth + server_batch
                latency[i] = max(0.0, st.comm_s.value - exchange)
    fallback = float(np.mean(list(latency.values()))) if latency else 0.0
    return [NodeProfile(p.node_id, p.compute_s_per_sample / contention, p.worker_bandwidth, p.server_bandwidth,
                        latency.get(p.node_id, fallback)) for p in profiles]


def pool_by_class(profiles: Sequence[NodeProfile], slots: Sequence[SlotInfo]) -> list[NodeProfile]:
    """Profiles with every slot of one declared node class given the class's mean figures (compute
    scaled by vcores). For slots the cluster declares identical (the containers of one job), what
    differs between their measurements is noise -- CPU contention, a slow mini-batch -- and taking
    it for hardware would make the solver trade blocks and roles over it."""
    by_id = {s.slot_id: s for s in slots}
    groups: dict[str, list[NodeProfile]] = {}
    for p in profiles:
        groups.setdefault(by_id[p.node_id].node_class, []).append(p)
    out = []
    for p in profiles:
        g = groups[by_id[p.node_id].node_class]
        cores = by_id[p.node_id].vcores
        compute = float(np.mean([q.compute_s_per_sample * by_id[q.node_id].vcores for q in g])) / cores
        out.append(NodeProfile(p.node_id, compute, float(np.mean([q.worker_bandwidth for q in g])),
                               float(np.mean([q.server_bandwidth for q in g])),
                               float(np.mean([q.latency_s_per_batch for q in g]))))
    return out
