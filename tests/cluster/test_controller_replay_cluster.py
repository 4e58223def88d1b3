"""The simulator runs the same PS-job controller as the real AM: a recorded run, replayed.

A real MLR job under optimizer "cruise" on a localhost cluster (RM + 3 NMs as processes) goes
through an EPS add (one more worker and one more server, asked at the AM's /scale endpoint), a
Cruise plan (an RM shape directive for two more containers: Cruise's optimizer decides their split
and the plan that gets there), a Harmony pause and resume (directives with run states), and an
executor kill (SIGKILL of a worker: its replacement takes over its splits). Its AM leaves its
controller log (`controller_log.json`: every event but the per-clock ones, the phase after it and
the instructions it gave). The simulator is then given the same spec, the same directives and
scale request at the same times after submission, the same kill, and the ops Cruise's optimizer
answered with (its decisions rest on measured timings: an input of the replay, as directives
are), and must go through the same sequence of phases and, in each stretch of one phase, issue the
same step instructions (a change's concurrent parts -- EPS adding a worker and a server, a plan's
ops -- interleave their steps by timing, so within a stretch they are compared as a multiset:
sim.am_replay.step_segments). Cruise's own proposals are held off (`min_batches` out of reach), so
the one plan is the directive's.

The job checkpoints only at its start (a checkpoint due every few epochs is skipped while a change
runs, so its place among the changes would depend on the machine's speed, not on the controller);
the directives are spaced so that each change ends before the next arrives. The real job (with an
epoch limit out of reach) is stopped two epochs after the recovery; the simulated one runs as long
as the real one was recorded, and both are compared up to there.
"""
from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as cev
from appmaster.ps.controller.records import Role
from appmaster.ps.runtime.interpreter import CONTROLLER_LOG_FILE, ControllerLog
from appmaster.ps.submission import build_ps_submission
from conftest import am_control_headers, am_status, get_app, rest, running_cluster, submit_app, wait_app
from polling import wait_until
from protocol.internal_api import RunState
from protocol.ps_status import PsStatus
from sim.am_replay import Loss, replay_directives, step_segments
from sim.calibration import load as load_calibration
from sim.simulator import SimConfig

pytestmark = pytest.mark.cluster


def _phases(log: ControllerLog) -> list[Phase]:
    out = [Phase.STARTING]
    for e in log.entries:
        p = Phase(e.phase)
        if p is not out[-1]:
            out.append(p)
    return out


def _segments(log: ControllerLog) -> list[tuple[Phase, Counter[str]]]:
    return step_segments([(Phase(e.phase), e.instructions) for e in log.entries])


def _scale(cluster: object, am_url: str, **change: int) -> None:
    """POST /scale on the AM (what `elastane ps scale` sends), answered once the change is done."""
    req = urllib.request.Request(am_url + "/scale", method="POST", data=json.dumps(change).encode(),
                                 headers={"Content-Type": "application/json", **am_control_headers(cluster, am_url)})
    with urllib.request.urlopen(req, timeout=120) as r:
        body = json.loads(r.read())
    assert all(c["ok"] for c in body["changes"]), body


def test_the_simulator_replays_a_recorded_am_run_through_the_same_phases_and_steps(tmp_path: Path) -> None:
    spec = {"app": "mlr", "workers": 1, "servers": 1, "max_workers": 4, "max_servers": 4, "max_epochs": 100_000,
            "data": {"num_samples": 40_000}, "optimizer": "cruise", "cruise": {"min_batches": 10**9},
            "convergence_threshold": 1e-12, "executor_memory_mb": 320, "hparams": {"learning_rate": 0.5}}
    # Room for six executors, the AM and the lost worker's replacement.
    with running_cluster(tmp_path / "cluster", node_memory_mb=1536, node_vcores=3) as cluster:
        app_id = submit_app(cluster.rm_url, build_ps_submission(spec, name="replayed", am_memory=384))
        shape_path = f"/ws/v1/cluster/apps/{app_id}/shape"

        def status() -> PsStatus | None:
            return am_status(cluster, app_id)

        def settled(version: int, epochs: int) -> PsStatus:
            """The directive `version` acted on, its change over, and `epochs` more trained."""
            st = wait_until(lambda: (s := status()) is not None and any(d.version == version for d in s.directives)
                            and s.state in ("TRAINING", "PAUSED") and s, 180, f"directive {version} carried out")
            if st.state == "PAUSED":
                return st
            return wait_until(lambda: (s := status()) is not None and s.state == "TRAINING"
                              and (s.epoch or 0) >= (st.epoch or 0) + epochs and s, 180, f"{epochs} epochs more")

        submitted_at = time.monotonic()

        def after(seconds: float, what: str) -> None:
            """Space the next scripted input `seconds` after submission: the replay gives the
            simulator each input at the same time, and its calibrated AM start, reshape, pause
            and restart must be over by then too (this spaces inputs, it checks no readiness)."""
            wait_until(lambda: time.monotonic() - submitted_at >= seconds, seconds + 1, what)

        st = wait_until(lambda: (s := status()) is not None and (s.epoch or 0) >= 2 and s, 180, "two epochs trained")
        am_url = str(get_app(cluster.rm_url, app_id)["trackingUrl"]).rstrip("/")
        after(10, "the EPS add's time")
        _scale(cluster, am_url, workers=1, servers=1)                                   # EPS add
        wait_until(lambda: (s := status()) is not None and s.state == "TRAINING"
                   and (s.epoch or 0) >= (st.epoch or 0) + 2, 180, "two epochs after the EPS add")
        after(22, "the Cruise plan's time")
        rest(cluster.rm_url, "PUT", shape_path, {"workers": 3, "servers": 3}, user="alice")        # a plan
        st = settled(1, 2)
        assert st.shape is not None
        shape = {"workers": st.shape.workers, "servers": st.shape.servers}
        after(34, "the pause's time")
        rest(cluster.rm_url, "PUT", shape_path, {**shape, "runState": "pause"}, user="alice")
        wait_until(lambda: (s := status()) is not None and s.state == "PAUSED", 120, "the job paused")
        after(44, "the resume's time")
        rest(cluster.rm_url, "PUT", shape_path, {**shape, "runState": "resume"}, user="alice")
        st = settled(3, 2)
        after(56, "the kill's time")
        st = status() or st
        # An executor kill: the newest worker's process, as its node's NM reports its end.
        workers = [e for e in (st.shape.executors if st.shape else []) if e.role == "worker" and e.state == "READY"]
        victim = max(workers, key=lambda e: int(e.id.rsplit("-", 1)[1]))
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        recovered = wait_until(lambda: (s := status()) is not None and s.recovery is not None
                           and s.recovery.recoveries == 1 and s, 120, "the lost worker replaced")
        wait_until(lambda: (s := status()) is not None and s.state == "TRAINING"
                   and (s.epoch or 0) >= (recovered.epoch or 0) + 2, 120, "two epochs after the recovery")
        rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        wait_app(cluster.rm_url, app_id, ("KILLED",), 60)
        # The AM saves its controller log after every change (and on a clean exit).
        wait_until(lambda: (Path(cluster.base_dir) / "rm" / "apps" / app_id / CONTROLLER_LOG_FILE).exists(), 30,
                   "the AM's controller log")
        app = get_app(cluster.rm_url, app_id)
        log = msgspec.json.decode((Path(cluster.base_dir) / "rm" / "apps" / app_id / CONTROLLER_LOG_FILE).read_bytes(),
                                  type=ControllerLog)
        submitted = app["startedTime"] / 1000.0

    # What the real run went through, up to its stop.
    real_phases, real_segments = _phases(log), _segments(log)
    if real_phases[-1] is Phase.KILLED:          # the log as the AM saved it on its way out
        real_phases, real_segments = real_phases[:-1], real_segments[:-1]
    assert real_phases[-1] is Phase.TRAINING
    for phase in (Phase.RESHAPING, Phase.EXECUTING_PLAN, Phase.PAUSED, Phase.RECOVERING):
        assert phase in real_phases, (phase, real_phases)
    directives = [(e.event.at - submitted, e.event.directive) for e in log.entries
                  if isinstance(e.event, cev.DirectiveArrived)]
    versions = sorted({d.version for _, d in directives})
    script = [(t, d) for t, d in directives if d.version in versions]
    script = [min((td for td in script if td[1].version == v), key=lambda td: td[0]) for v in versions]
    losses = [Loss(e.event.at - submitted, Role.WORKER) for e in log.entries
              if isinstance(e.event, cev.ContainersCompleted) and Phase(e.phase) is Phase.RECOVERING]
    assert [d.run_state for _, d in script] == [RunState.RUN, RunState.PAUSE, RunState.RESUME]
    assert len(losses) == 1, [e.event for e in log.entries if isinstance(e.event, cev.ContainersCompleted)]
    outside = [(e.event.at - submitted, e.event) for e in log.entries
               if isinstance(e.event, (cev.ScaleRequested, cev.PlanProposed))]
    assert [type(e) for _, e in outside] == [cev.ScaleRequested], outside
    plans = [e.event.ops for e in log.entries if isinstance(e.event, cev.StepDone) and e.event.ops]
    assert len(plans) == 1 and plans[0], [e.instructions for e in log.entries]

    # The same spec, directives and kill in the simulator.
    # Simulated as long as the real run was recorded, and a minute more; the data is twice the
    # 20,000 rows the calibration's MLR reference job trains on.
    horizon = max(e.event.at for e in log.entries) - submitted + 60.0
    replay = replay_directives(log.spec, script, load_calibration(), losses=losses, data_scale=2.0,
                               outside=outside, plans=plans,
                               cfg=SimConfig(nodes=4, am_nodes=1, max_virtual_s=horizon))
    n = len(real_phases)
    assert replay.phases[:n] == real_phases, (replay.phases, real_phases)
    assert replay.segments()[:len(real_segments)] == real_segments, (replay.segments(), real_segments)
