"""The simulator's trace format: one job a line, JSON (docs/simulator.md has the full reference).

    {"name": "j0001", "arrival_s": 12.5, "app": "mlr", "data_scale": 40.0, "hparams": {},
     "threshold": 0.02, "workers": 2, "servers": 1, "min_workers": 1, "min_servers": 1,
     "max_workers": 8, "max_servers": 4, "user": "u1", "queue": "default"}

`app` is a built-in app (mlr, nmf, lda, lasso) or, as a PS job spec's user app is, "module:Class":
the paper workloads (sim/papers/) name their synthetic job types so, e.g. "optimus:ResNet50"; the
simulator needs a calibration entry for every app a trace names. `data_scale` is the job's data size as a multiple of the data its app was calibrated on
(sim/calibration.json's `reference`); `threshold` is the convergence threshold (relative change of
the training objective between two epochs, as the real apps use it). Blank lines and lines starting
with `#` are skipped. `read_trace` reports a bad line as `TraceError("line N: field: problem")`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, Optional

import msgspec
from protocol.errors import ConfigurationError

Pos = Annotated[int, msgspec.Meta(ge=1)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0.0)]
APPS = ("mlr", "nmf", "lda", "lasso")
# A built-in app, or "module:Class" as protocol/ps_job_spec.py names a user app.
APP_PATTERN = r"^(mlr|nmf|lda|lasso|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$"
AppName = Annotated[str, msgspec.Meta(pattern=APP_PATTERN)]


class TraceError(ConfigurationError, ValueError):
    """A trace that cannot be read; the message names the line and the field."""


class TraceJob(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """One job of a trace (see the module doc)."""

    arrival_s: NonNegFloat
    app: AppName
    threshold: Annotated[float, msgspec.Meta(gt=0.0, lt=1.0)]
    workers: Pos
    servers: Pos
    name: str = ""
    data_scale: Annotated[float, msgspec.Meta(gt=0.0)] = 1.0
    hparams: dict[str, Any] = {}
    min_workers: Optional[Pos] = None       # default: workers (a rigid job)
    min_servers: Optional[Pos] = None
    max_workers: Optional[Pos] = None       # default: workers
    max_servers: Optional[Pos] = None
    user: str = "user"
    queue: str = "default"
    sync: Literal["bsp", "ssp"] = "bsp"
    elastic_mode: Literal["eps", "kill"] = "eps"
    executor_memory_mb: Annotated[int, msgspec.Meta(ge=64)] = 512
    executor_vcores: Pos = 1
    max_epochs: Optional[Pos] = None        # a cap on the epochs whatever the threshold
    early_feedback_iterations: Optional[Pos] = None   # the job spec's (EPS §2.1); None: the spec default
    model_mb: Optional[NonNegFloat] = None  # parameter state (resize costs scale with it); None: the app's reference
    weight: Annotated[float, msgspec.Meta(gt=0.0)] = 1.0    # the spec's weight (weighted DRF, Dorm's w)

    def __post_init__(self) -> None:
        if self.min_workers is not None and self.min_workers > self.workers:
            raise ValueError(f"min_workers {self.min_workers} is above workers {self.workers}")
        if self.min_servers is not None and self.min_servers > self.servers:
            raise ValueError(f"min_servers {self.min_servers} is above servers {self.servers}")
        if self.max_workers is not None and self.max_workers < self.workers:
            raise ValueError(f"max_workers {self.max_workers} is below workers {self.workers}")
        if self.max_servers is not None and self.max_servers < self.servers:
            raise ValueError(f"max_servers {self.max_servers} is below servers {self.servers}")

    @property
    def shape_min(self) -> tuple[int, int]:
        return (self.min_workers or self.workers, self.min_servers or self.servers)

    @property
    def shape_max(self) -> tuple[int, int]:
        return (self.max_workers or self.workers, self.max_servers or self.servers)


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)


def _describe(e: msgspec.ValidationError) -> str:
    m = _AT.match(str(e))
    if m is None or not m.group("path"):
        return str(e)
    return f"{m.group('path').lstrip('.')}: {m.group('msg')}"


def parse_trace(lines: Iterable[str]) -> list[TraceJob]:
    """Jobs of a trace in arrival order (ties: line order); unnamed jobs get `j<line>`."""
    jobs: list[tuple[float, int, TraceJob]] = []
    for n, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            job = msgspec.json.decode(text.encode(), type=TraceJob)
        except msgspec.ValidationError as e:
            raise TraceError(f"line {n}: {_describe(e)}") from None
        except msgspec.DecodeError as e:
            raise TraceError(f"line {n}: not a JSON object ({e})") from None
        if not job.name:
            job = msgspec.structs.replace(job, name=f"j{n:04d}")
        jobs.append((job.arrival_s, n, job))
    if not jobs:
        raise TraceError("the trace holds no jobs")
    names = [j.name for _, _, j in jobs]
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise TraceError(f"job names must be unique; repeated: {', '.join(dup[:5])}")
    return [j for _, _, j in sorted(jobs, key=lambda x: (x[0], x[1]))]


def read_trace(path: Path) -> list[TraceJob]:
    try:
        text = path.read_text()
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror or e}") from None
    return parse_trace(text.splitlines())


def dump_trace(jobs: Iterable[TraceJob]) -> str:
    """The trace as text, one job a line (defaults left out)."""
    enc = msgspec.json.Encoder()
    out = []
    for j in jobs:
        d = msgspec.to_builtins(j)
        defaults = {f: v for f, v in msgspec.to_builtins(TraceJob(arrival_s=0.0, app="mlr", threshold=0.5,
                                                                    workers=1, servers=1)).items()}
        keep = {k: v for k, v in d.items()
                if k in ("arrival_s", "app", "threshold", "workers", "servers", "name") or v != defaults.get(k)}
        out.append(enc.encode(keep).decode())
    return "\n".join(out) + "\n"


__all__ = ["APPS", "APP_PATTERN", "TraceError", "TraceJob", "dump_trace", "parse_trace", "read_trace"]
