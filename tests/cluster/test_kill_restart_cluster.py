"""The kill-based baseline on a real localhost cluster (RM + 3 NMs as processes).

A tiny MLR job with elastic_mode "kill" gets two shape directives through the AM library's event
path (the AM entry point below is the PS AM plus a script that emits `ShapeChanged` events at
given epochs, as the RM's policy would): remove a worker and a server, then add them back. Each
change checkpoints, stops every executor, starts the job again and restores the model. Checked:
the objective continues where it was (the restored objective equals the checkpoint's, no jump back
to the untrained one), epochs carry on without a gap, every change is in the shape history with
its steps and the training time it lost, the old executors' processes are gone, and the final
objective is within 5% of the same job trained without changes (run beside it)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from appmaster.ps.checkpoints import checkpoint_position

from appmaster.ps.submission import build_ps_submission
from conftest import get_app, pids_with_env, running_cluster, submit_app, wait_app
from polling import wait_until
from ps_am_status import final_status
from protocol import container_env
from protocol.shape_history import ExecutorCounts, KillRestartChange
from scripted_am import use_scripted_am

pytestmark = pytest.mark.cluster

EXECUTOR_MB = 320
SCRIPT_ENV = "ELASTANE_TEST_DIRECTIVES"

# The PS AM with scripted directives: each step's directive is emitted once training has reached
# its epoch and the previous change has been applied. The check runs after every BSP clock (the
# training controller's on_clock, which a restarted controller inherits), not on a timer: how many
# epochs pass between the step's epoch and the restart then depends on the training loop's order
# of events, not on how many epochs a fast host trains during a poll interval.
SCRIPTED_DIRECTIVES = f"""
def make_hook(master, am):
    steps = json.loads(os.environ.get("{SCRIPT_ENV}", "[]"))
    emitted = 0

    def hook():
        nonlocal emitted
        if emitted == len(steps) or master.job.change is not None or master.job.applied_directive < emitted:
            return
        step = steps[emitted]
        if master.training.loop.epochs_done >= step["after_epoch"]:
            emitted += 1
            am._emit(ShapeChanged(ShapeDirective(workers=step["workers"], servers=step["servers"],
                                                 version=emitted, reason="scripted by the test")))
    return hook
"""


# 12 slots of 512 MB and 1 vcore: the two jobs of a test (5 containers each) fit
# side by side, so neither waits for the other's containers.
@pytest.fixture(scope="module")
def kill_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_cluster(tmp_path_factory.mktemp("kill-cluster"), node_memory_mb=2048, node_vcores=4,
                         nm_expiry_s=5, am_expiry_s=30) as c:   # AMs start slowly on a loaded 2-core machine
        yield c


def submit_scripted(cluster: Any, spec: dict[str, Any], steps: list[dict[str, int]], name: str,
                    tmp_path: Path) -> str:
    sub = build_ps_submission({"executor_memory_mb": EXECUTOR_MB, **spec}, name=name, am_memory=384)
    script_dir = tmp_path / name
    script_dir.mkdir()
    return submit_app(cluster.rm_url, use_scripted_am(sub, script_dir, SCRIPTED_DIRECTIVES,
                                                      {SCRIPT_ENV: json.dumps(steps)}))


def test_kill_based_remove_and_add_back_keeps_training_progress(kill_cluster, tmp_path: Path) -> None:
    spec = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 8, "elastic_mode": "kill",
            "hparams": {"learning_rate": 0.5}}
    steps = [{"after_epoch": 2, "workers": 1, "servers": 1}, {"after_epoch": 4, "workers": 2, "servers": 2}]
    changed = submit_scripted(kill_cluster, spec, steps, "kill-reshaped", tmp_path)
    steady = submit_scripted(kill_cluster, spec, [], "kill-steady", tmp_path)
    for app_id in (changed, steady):
        app = wait_app(kill_cluster.rm_url, app_id, ("FINISHED",), 240)
        assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    for app_id in (changed, steady):
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")

    st, base = final_status(kill_cluster, changed), final_status(kill_cluster, steady)
    assert base.shape_history == [] and st.elastic_mode == "kill"

    # Two restarts, each with every step timed and its lost training time.
    hist = [h for h in st.shape_history if isinstance(h, KillRestartChange)]
    assert hist == st.shape_history
    assert [(h.changed, h.workers, h.servers) for h in hist] == [(True, 1, 1), (True, 2, 2)], hist
    assert [h.before for h in hist] == [ExecutorCounts(2, 2), ExecutorCounts(1, 1)]
    for h in hist:
        assert set(h.steps) == {"wait_boundary_s", "checkpoint_s", "release_s", "allocate_s", "restore_s"}
        assert h.seconds > 0 and h.lost_s == h.seconds and h.error == ""
        assert h.objective_restored == pytest.approx(h.objective_before, rel=1e-4)   # no reset
        # Each restart went through a checkpoint of its own cut (pruned later: the AM keeps the two
        # newest, so the final one is there).
        assert isinstance(h.checkpoint, str) and checkpoint_position(Path(h.checkpoint).name) is not None
    assert st.checkpoints and Path(st.checkpoints[-1].dir).is_dir()
    # Each restart paused at a clock boundary at or after the epoch its step asked for, and the
    # second after the first. How many epochs trained while a directive travelled depends on the
    # host's speed, so there is no upper bound here (the shape history having both changes is what
    # says they came while the job still trained).
    epochs = [h.epoch for h in hist]
    assert all(isinstance(e, int) for e in epochs), hist       # every restart reached its cut
    for e, step in zip(epochs, steps):
        assert e >= step["after_epoch"], (hist, steps)
    assert epochs[0] <= epochs[1] and hist[0].time < hist[1].time, hist

    # Epochs carry on without a gap or a reset; each executor generation ran in its own containers.
    history = st.objective_history
    assert [h.epoch for h in history] == list(range(8))
    obj = [st.initial_objective] + [h.objective for h in history]
    assert None not in obj and st.initial_objective is not None      # every objective finite
    for h, e in zip(hist, epochs):
        after = obj[e + 1]            # the first epoch trained by the restarted job
        assert after < 1.02 * h.objective_before < st.initial_objective, (h, obj)
    assert st.shape is not None
    executors = st.shape.executors
    assert sum(e.role == "worker" for e in executors) == 2 + 1 + 2
    assert sum(e.role == "server" for e in executors) == 2 + 1 + 2
    assert len({e.container_id for e in executors}) == len(executors)

    # The same result as training without changes, within a stated tolerance.
    final, ref = obj[-1], base.objective_history[-1].objective
    assert final is not None and ref is not None
    assert abs(final - ref) <= 0.05 * abs(ref), (final, ref)
    assert final < 0.6 * st.initial_objective
    assert get_app(kill_cluster.rm_url, changed)["diagnostics"].startswith("final objective")
