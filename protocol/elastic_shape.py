"""What an elastic PS AM reports about its job on every heartbeat (`AllocateRequest.shape`).

The RM stores the dict as it comes (`/ws/v1/cluster/apps/{id}/shape` shows it) and the elastic
policies (`eps`, later `optimus`, `dorm`) read it through `ElasticShapeReport.parse`. Example::

    {"workers": 3, "servers": 2, "started": true, "changing": false,
     "iterations": 240, "early_feedback": true, "early_feedback_iterations": 100,
     "speed": 1.8, "speed_iterations": 40,
     "executor_resource": {"memory": 512, "vCores": 1}, "directive_version": 2}

Fields, and what the AM must put in them:

- `workers`, `servers`: executors running in each role now (granted, launched and serving). While
  the job is starting they count what has come up so far.
- `started`: the job holds the workers and servers it was submitted with and training has begun.
  Until then the policies treat the job as still waiting (an *incoming* job in EPS's words).
- `changing`: a reconfiguration (add / remove workers or servers) is under way; `workers` and
  `servers` are the counts before it completes.
- `iterations`: iterations (clock ticks of the whole job: one pull-compute-push round of every
  worker) completed since the job started.
- `early_feedback`: the job has finished its early-feedback phase, i.e. `iterations >=
  early_feedback_iterations` (the job option, EPS §2.1: "e.g. the first 100 iterations"). The EPS
  H-scheduler never removes workers or servers from a job before that, nor adds any.
- `early_feedback_iterations`: that job option, echoed so operators see it in the job status.
- `speed`: training speed in iterations per second, measured over the iterations completed since
  the last reconfiguration finished (so it describes the current shape); 0.0 when unknown.
- `speed_iterations`: how many iterations `speed` was measured over (resets to 0 when a
  reconfiguration finishes). Policies only trust a speed measured over enough iterations.
- `executor_resource`: the resource of one executor container as granted (after the RM's rounding).
- `directive_version`: the version of the last shape directive the AM has acted on (0: none).

Unknown fields are ignored, so an AM may report more (epoch, objective, ...) and older AMs that
send only workers / servers still parse.
"""
from __future__ import annotations

from typing import Annotated, Any, Optional

import msgspec

from .records import Resource

NonNeg = Annotated[int, msgspec.Meta(ge=0)]


class ElasticShapeReport(msgspec.Struct, kw_only=True):
    """One elastic job's shape and training progress as its AM reports it (see the module doc)."""

    workers: NonNeg
    servers: NonNeg
    started: bool = False
    changing: bool = False
    iterations: NonNeg = 0
    early_feedback: bool = False
    early_feedback_iterations: NonNeg = 0
    speed: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0
    speed_iterations: NonNeg = 0
    executor_resource: Optional[Resource] = None
    directive_version: NonNeg = 0

    def to_json(self) -> dict[str, Any]:
        """The dict an AM puts in `AllocateRequest.shape`."""
        return msgspec.to_builtins(self)

    @classmethod
    def decode(cls, shape: Any) -> "ElasticShapeReport":
        """Decode a reported shape; `msgspec.ValidationError` names the bad field."""
        return msgspec.convert(shape, cls, strict=True)

    @classmethod
    def parse(cls, shape: Optional[dict]) -> Optional["ElasticShapeReport"]:
        """The report in `shape`, or None when there is none or it is not a valid report
        (a policy treats such a job as not reporting rather than failing the whole decision)."""
        if shape is None:
            return None
        try:
            return cls.decode(shape)
        except (msgspec.ValidationError, TypeError):
            return None


__all__ = ["ElasticShapeReport"]
