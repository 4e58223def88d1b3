"""The `optimus-truth` policy: Optimus's allocation rule fed the true curves -- not a bound.

Optimus (rm/policies/optimus.py) sizes jobs by the marginal gain of one more worker or server in
the job's remaining time t = Q / f(p, w) (§4.1), with Q and f fitted from the job's reports. This
policy runs the same greedy allocation (rm/policies/optimus_alloc.py) on what only the simulator
knows: each job's true remaining epochs (the epoch count the simulated job stops at, less what it
trained) and its true speed function (the calibrated epoch-time model at its data size,
models.ps_iteration_time, in Optimus's feature form). A change is made only when the time it saves
exceeds its true cost (the job's reshape or restart cost, sim/calibration.py), and a job in the
middle of a change keeps its target.

It is NOT an upper bound on what a scheduler can do (it was called "the oracle" before issue 33):
the rule is greedy, and it differs from the `optimus` policy in more than its inputs -- no
placement (Theorem 1's fewest nodes: the simulated cluster charges nothing for spreading a job,
sim/iteration_time.py models CPU contention, not network locality), no priority factor for early
jobs (it damps prediction errors), and a lower resize hysteresis (the true cost instead of
Optimus's margin). So "Optimus over optimus-truth" mixes the cost of Optimus's estimates with
those differences; bench/policies_sim.py reports it as such, and reports Optimus against a true
bound separately (sim/bounds.py: a clairvoyant lower bound on mean JCT and makespan).

`TruthInputs` is the other use of the truth: it hands Optimus's own policy (its estimates, rule,
priority factor, hysteresis and placement) the true speed function or the true remaining epochs in
place of its estimate of one of them (rm/policies/optimus.py `KnownInputs`) -- the simulator's
`optimus-true-speed` and `optimus-true-epochs`, which measure what each estimate costs Optimus.
Like optimus-truth, neither is a bound nor a policy a real RM could run.

The policy is an object the simulator builds with a `Truth` callable (it is not in the RM's
policy registry: a real RM has no truth to give it). `simulate(trace, "optimus-truth", ...)`
builds it (sim/simulator.py, `SIM_POLICIES`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from models.optimus_fit import FEATURES, SpeedFunction
from protocol.records import Resource
from rm.policies.decision import Decision, JobDecision
from rm.policies.eps_jobs import RunningJob, clamp0, classify
from rm.policies.optimus_alloc import AllocationProblem, allocate, remaining_time
from rm.policies.snapshot import ClusterSnapshot

# Optimus's round interval (rm/policies/optimus.py SCHEDULING_INTERVAL_S): the policy re-plans as
# often, and at once when jobs arrive, start or leave.
SCHEDULING_INTERVAL_S = 30.0
# The epoch-time θ of models.ps_iteration_time (T = θ0/w + θ1 + θ2·w/s + θ3·w + θ4·s) in
# models.optimus_fit.FEATURES ("1/w", "1/p", "1", "w/p", "w", "p", "p/w"): θ_i goes to feature
# THETA_TO_FEATURE[i].
THETA_TO_FEATURE = (FEATURES.index("1/w"), FEATURES.index("1"), FEATURES.index("w/p"), FEATURES.index("w"),
                    FEATURES.index("p"))


@dataclass(frozen=True)
class JobTruth:
    """What the simulator knows of a job: epochs left, its epoch-time θ at its data size (seconds),
    what a change of shape costs it, and whether a change is under way."""

    remaining_epochs: float
    theta: tuple[float, ...]
    change_cost_s: float
    busy: bool


Truth = Callable[[str], Optional[JobTruth]]


def coefficients(theta: tuple[float, ...]) -> np.ndarray:
    """The epoch-time θ as Optimus's 1/f coefficients over FEATURES (a θ of len(FEATURES) already is:
    sim/papers/speed.py's seven-feature model, which an asynchronous paper job's eq. 3 needs)."""
    if len(theta) == len(FEATURES):
        return np.array(theta, dtype=float)
    out = np.zeros(len(FEATURES))
    for i, v in zip(THETA_TO_FEATURE, theta):
        out[i] = v
    return out


@dataclass(frozen=True)
class TruthInputs:
    """The true speed function and/or remaining epochs of a job, for Optimus's `KnownInputs`
    (module doc); None for what is not to be known, and for a job the simulator does not know."""

    truth: Truth
    speed_known: bool
    epochs_known: bool

    def speed(self, app_id: str, sync: bool) -> Optional[SpeedFunction]:
        t = self.truth(app_id) if self.speed_known else None
        return None if t is None else SpeedFunction(tuple(float(c) for c in coefficients(t.theta)), sync)

    def remaining_epochs(self, app_id: str) -> Optional[float]:
        t = self.truth(app_id) if self.epochs_known else None
        return None if t is None else t.remaining_epochs


class OptimusTruthPolicy:
    """Optimus's marginal-gain allocation on the true remaining epochs and speed (module doc)."""

    name = "optimus-truth"

    def __init__(self, truth: Truth, interval_s: float = SCHEDULING_INTERVAL_S) -> None:
        self.truth = truth
        self.interval_s = interval_s
        self._last_round: Optional[float] = None
        self._last_jobs: tuple[tuple[str, ...], ...] = ()

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        view = classify(snapshot)
        present = (tuple(j.app_id for j in view.running), tuple(j.app_id for j in view.incoming), view.other_queued)
        if (self._last_round is not None and present == self._last_jobs
                and snapshot.now < self._last_round + self.interval_s):
            return Decision({})
        self._last_round, self._last_jobs = snapshot.now, present
        apps = {a.app_id: a for a in snapshot.apps}
        budget = snapshot.total - snapshot.used
        for j in view.running:
            budget = budget + clamp0(j.held - j.am)
        for inc in view.incoming:
            budget = budget - inc.need
        for app_id in view.other_queued:
            budget = budget - apps[app_id].pending
        sized: list[tuple[RunningJob, JobTruth]] = []
        for j in view.running:
            t = self.truth(j.app_id)
            if t is None or t.busy or t.remaining_epochs <= 0:
                budget = budget - j.executor.scale(j.workers + j.servers)   # keeps what it has
                continue
            sized.append((j, t))
        if not sized:
            return Decision({})
        for j, _ in sized:
            budget = budget - j.executor.scale(j.spec.min_workers + j.spec.min_servers)
        servers, workers = allocate(self._problem(sized, budget, snapshot.total))
        out: dict[str, JobDecision] = {}
        for (j, t), s, w in zip(sized, servers, workers):
            target = (int(w), int(s))
            if target == (j.workers, j.servers):
                continue
            coef = coefficients(t.theta)[None, :]
            q = np.array([t.remaining_epochs])
            now = float(remaining_time(coef, q, np.array([j.servers]), np.array([j.workers]))[0])
            new = float(remaining_time(coef, q, np.array([target[1]]), np.array([target[0]]))[0])
            if now - new <= t.change_cost_s and target[0] >= j.workers and target[1] >= j.servers:
                continue     # a growth that saves less than it costs; a shrink is made (others need the room)
            out[j.app_id] = JobDecision(*target, reason=f"optimus-truth: {t.remaining_epochs:.1f} epochs left, "
                                                        f"{new:.0f}s at {target[0]} workers / {target[1]} servers")
        return Decision(dict(sorted(out.items())))

    @staticmethod
    def _problem(sized: list[tuple[RunningJob, JobTruth]], budget: Resource, total: Resource) -> AllocationProblem:
        n = len(sized)
        ex = np.array([[j.executor.memory, j.executor.vcores] for j, _ in sized], dtype=float).reshape(n, 2)
        cap = np.array([max(1, total.memory), max(1, total.vcores)], dtype=float)
        return AllocationProblem(
            remaining=np.array([t.remaining_epochs for _, t in sized], dtype=float),
            coefficients=np.array([coefficients(t.theta) for _, t in sized], dtype=float).reshape(n, len(FEATURES)),
            servers=np.array([max(1, j.spec.min_servers) for j, _ in sized], dtype=np.int64),
            workers=np.array([max(1, j.spec.min_workers) for j, _ in sized], dtype=np.int64),
            max_servers=np.array([max(1, j.spec.max_servers) for j, _ in sized], dtype=np.int64),
            max_workers=np.array([max(1, j.spec.max_workers) for j, _ in sized], dtype=np.int64),
            executor=ex, dominant=np.maximum((ex / cap).max(axis=1), 1e-12), factor=np.ones(n),
            budget=np.array([budget.memory, budget.vcores], dtype=float))


__all__ = ["JobTruth", "OptimusTruthPolicy", "SCHEDULING_INTERVAL_S", "Truth", "TruthInputs", "coefficients"]
