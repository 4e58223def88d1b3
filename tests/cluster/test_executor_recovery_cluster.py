"""A PS job survives a lost server and a lost worker (RM + 3 NMs as processes).

Three MLR jobs side by side (2 workers, 2 servers, checkpoints every 2 epochs, four clocks an
epoch, the exactly-once audit on): in one the AM SIGKILLs its server-0 process after the first
clock of epoch 3, in another its worker-1, the third trains undisturbed as the reference. The fault is injected by a small AM
script at a point that does not depend on how fast the host is. Checked: both faulted jobs SUCCEED
and the servers applied every mini-batch the workers ran exactly once, with the final objective
within 1 % of the undisturbed run. The lost worker was replaced by one new worker that ran the
lost clock again, with no epoch redone and no checkpoint used (its shape history has one
"replace_worker" record); the lost server was rebuilt on a new one from the latest checkpoint and
the workers' pushes since (one "rebuild_server" record naming it), only its clock run again.
Either way the epochs form one contiguous run. NMF, which keeps user factors on its workers, goes
back to a checkpoint after a lost worker (every executor new) and after a lost server (new
servers, its workers kept), its user factors restored either way.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from appmaster.ps.checkpoints import checkpoint_position

from appmaster.ps.submission import build_ps_submission
from conftest import pids_with_env, running_cluster, submit_app, wait_app
from polling import wait_until
from ps_am_status import final_status
from protocol import container_env
from protocol.ps_status import PsStatus
from protocol.shape_history import RebuildServerChange, RecoveryChange, ReplaceWorkerChange
from scripted_am import use_scripted_am

pytestmark = pytest.mark.cluster

VICTIM_ENV = "ELASTANE_TEST_KILL_EXECUTOR"

# Once epoch 3 is done the AM SIGKILLs the process of executor $VICTIM_ENV (none if empty).
KILL_EXECUTOR = f"""
def make_hook(master, am):
    victim = os.environ.get("{VICTIM_ENV}")
    done = []

    def hook():
        if victim and not done and master.training.loop.epochs_done >= 3:
            done.append(victim)
            os.kill(master.pool.executors[victim].pid, signal.SIGKILL)
    return hook
"""


@pytest.fixture(scope="module")
def recovery_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_cluster(tmp_path_factory.mktemp("exec-recovery"), node_memory_mb=2048, node_vcores=6,
                         am_expiry_s=30) as c:   # three AMs start at once on a small machine
        yield c


MLR = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 12, "convergence_threshold": 1e-12,
       "checkpoint_every_epochs": 2, "audit_updates": True, "executor_memory_mb": 320, "push_log": True,
       "clock_batches": 5,     # 4 clocks an epoch: the worker dies between two of them
       "hparams": {"learning_rate": 0.5}}


def last_objective(status: PsStatus) -> float:
    """The objective after the job's last epoch (finite: a null would fail here)."""
    objective = status.objective_history[-1].objective
    assert objective is not None, status.objective_history
    return objective


def submit(cluster: Any, name: str, tmp_path: Path, victim: str, spec: dict[str, Any] = MLR) -> str:
    sub = build_ps_submission(spec, name=name, am_memory=384)
    return submit_app(cluster.rm_url, use_scripted_am(sub, tmp_path, KILL_EXECUTOR, {VICTIM_ENV: victim}))


def test_lost_server_and_lost_worker_are_replaced_and_training_goes_on(recovery_cluster, tmp_path: Path) -> None:
    cluster = recovery_cluster
    jobs = {victim: submit(cluster, f"lose-{victim or 'nothing'}", tmp_path, victim)
            for victim in ("server-0", "worker-1", "")}
    for app_id in jobs.values():
        app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 240)
        assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    status = {v: final_status(cluster, a) for v, a in jobs.items()}
    reference = last_objective(status[""])
    ok = status[""].recovery
    assert ok is not None and ok.failures == 0 and ok.enabled
    for victim in ("server-0", "worker-1"):
        st = status[victim]
        assert st.recovery is not None and st.recovery.failures == 1, st.recovery
        assert [h.epoch for h in st.objective_history] == list(range(12)), st.objective_history
        assert st.eps is not None and st.eps.audit_mismatches == [], st.eps
        assert st.eps.minibatches_applied == st.eps.minibatches_run > 0
        final = last_objective(st)
        assert abs(final - reference) <= 0.01 * abs(reference), (victim, final, reference)
    # The lost server: rebuilt on one new server from the checkpoint of epoch 2 and the workers'
    # pushes since; only the clock it was lost in ran again (no epoch redone, nothing gone back to).
    st = status["server-0"]
    [rec] = [h for h in st.shape_history if isinstance(h, (RecoveryChange, ReplaceWorkerChange))]
    assert isinstance(rec, RebuildServerChange) and rec.error == "" and rec.changed, rec
    assert "server-0 (" in rec.lost[0] and rec.replacements == {"server-0": "server-2"}, rec
    assert rec.epochs_redone == 0 and rec.clock_redone and rec.keys_replayed > 0, rec
    assert Path(rec.checkpoint).name == "epoch-2", rec
    assert st.recovery is not None and (st.recovery.recoveries, st.recovery.replacements) == (1, 0), st.recovery
    assert st.shape is not None
    executors = sorted(e.id for e in st.shape.executors)       # one new server, no worker
    assert executors == ["server-0", "server-1", "server-2", "worker-0", "worker-1"], executors
    # The lost worker: one new worker in its place, the clock it was lost in run again, no epoch
    # redone and no checkpoint gone back to.
    st = status["worker-1"]
    [rep] = [h for h in st.shape_history if isinstance(h, (RecoveryChange, ReplaceWorkerChange))]
    assert type(rep) is ReplaceWorkerChange and rep.error == "" and rep.changed, rep
    assert "worker-1 (" in rep.lost[0] and rep.epochs_redone == 0 and rep.epoch >= 3, rep
    assert rep.clock_redone and rep.replacements == {"worker-1": "worker-2"}, rep
    assert st.recovery is not None and (st.recovery.recoveries, st.recovery.replacements) == (1, 1), st.recovery
    assert st.shape is not None
    executors = {e.id: e for e in st.shape.executors}
    assert sorted(executors) == ["server-0", "server-1", "worker-0", "worker-1", "worker-2"], executors
    assert executors["worker-1"].state == "EXITED" and executors["worker-2"].blocks, executors
    for app_id in jobs.values():
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")


def test_nmf_user_factors_come_back_from_the_checkpoint_after_a_lost_worker_or_server(recovery_cluster,
                                                                                       tmp_path: Path) -> None:
    """NMF keeps its user factors on the workers: checkpoints hold them with the servers' item
    factors (one cut). A lost worker sends the job back to the checkpoint on new executors; a lost
    server sends it back on new servers with the workers kept, whose user factors go back to the
    checkpoint's. Either way both come back."""
    cluster = recovery_cluster
    spec = {"app": "nmf", "workers": 2, "servers": 1, "max_epochs": 10, "convergence_threshold": 1e-12,
            "checkpoint_every_epochs": 2, "audit_updates": True, "executor_memory_mb": 320}
    jobs = {victim: submit(cluster, f"nmf-lose-{victim or 'nothing'}", tmp_path, victim, spec)
            for victim in ("worker-0", "server-0", "")}
    for app_id in jobs.values():
        app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 240)
        assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    ref = final_status(cluster, jobs[""])
    for victim, kept in (("worker-0", 0), ("server-0", 2)):
        st = final_status(cluster, jobs[victim])
        rec = [h for h in st.shape_history if isinstance(h, RecoveryChange)]
        assert len(rec) == 1 and rec[0].error == "" and f"{victim} (" in rec[0].lost[0], st.shape_history
        assert rec[0].workers_kept == kept, rec
        # The checkpoints hold the workers' block state (the recovery's own one may be pruned by
        # now: the AM keeps the two newest; its final one is still there).
        assert checkpoint_position(Path(rec[0].checkpoint).name) is not None
        assert st.checkpoints and (Path(st.checkpoints[-1].dir) / "worker_state_0.buf").exists()
        assert rec[0].objective_restored == pytest.approx(
            st.objective_history[rec[0].epoch - 1].objective if rec[0].epoch else st.initial_objective,
            rel=1e-3), victim                                                   # the user factors came back too
        assert [h.epoch for h in st.objective_history] == list(range(10))
        assert st.eps is not None and st.eps.audit_mismatches == []
        final, expected = last_objective(st), last_objective(ref)
        # NMF ends near its noise floor, where two undisturbed runs (asynchronous pushes of two
        # workers) already differ by a few per cent of the small final value: compare the progress.
        assert ref.initial_objective is not None
        progress = ref.initial_objective - expected
        assert abs(final - expected) <= 0.01 * progress, (victim, final, expected, progress)
