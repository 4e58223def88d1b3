"""A new AM attempt continues a PS job the failed attempt left (RM + 3 NMs): it takes the
running executors over (work-preserving AM restart), or, when the RM did not keep them, resumes
from the checkpoint the failed attempt left.

MLR jobs (2 workers, 2 servers, checkpoints every 2 epochs, the exactly-once audit on, 2 attempts
allowed) run under the PS AM plus a fault script: in the first attempt only, the AM SIGKILLs itself
-- a crashed AM host, at a point that does not depend on how fast the machine is. A reference job
of the same spec trains beside them without a fault.

- Take-over (the default for PS jobs: the RM keeps the executors running for attempt 2): the AM
  dies right after a clock in the middle of epoch 4, once the record it keeps for the next attempt
  is on disk. Checked: attempt 2 SUCCEEDS with the first attempt's executors (the same containers,
  none started anew), having restored nothing; the objective history is one run of epochs with none
  redone; the audit finds every mini-batch applied exactly once; the final objective is within 1 %
  of the reference's.
- Checkpoint (keep-containers-across-application-attempts false): the AM dies right after the
  checkpoint of epoch 4 is on disk. The RM cleans up the first attempt's executors and starts
  attempt 2, which resumes from epoch 4 (not 0). Checked: it SUCCEEDS in attempt 2, resumed from
  epoch 4, with one contiguous run of epochs, no jump back to the untrained objective, the first
  attempt's executors gone while the second trained, and the final objective within 1 % of the
  reference's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import pids_with_env, rest, running_cluster, submit_app, wait_app
from polling import wait_until
from ps_am_status import final_status
from protocol import container_env
from scripted_am import use_scripted_am

pytestmark = pytest.mark.cluster

FAULT_ENV = "ELASTANE_TEST_KILL_AM_AFTER_CHECKPOINT"

# In attempt 1 the AM SIGKILLs itself after the first clock that follows a checkpoint of epoch
# >= $FAULT_ENV.
KILL_AFTER_CHECKPOINT = f"""
def make_hook(master, am):
    after = int(os.environ["{FAULT_ENV}"])
    first_attempt = os.environ[container_env.APP_ATTEMPT_ID].endswith("_000001")

    def hook():
        if first_attempt and any(c.epoch >= after for c in master.checkpointer.written):
            os.kill(os.getpid(), signal.SIGKILL)
    return hook
"""


# In attempt 1 the AM SIGKILLs itself after the first clock inside an epoch >= $FAULT_ENV, once the
# record it keeps for the next attempt (written at every epoch's end) covers the epochs done.
KILL_MID_EPOCH = f"""
def make_hook(master, am):
    after = int(os.environ["{FAULT_ENV}"])
    first_attempt = os.environ[container_env.APP_ATTEMPT_ID].endswith("_000001")
    record = Path(os.environ[container_env.AM_DIR]) / "attempt_handover.json"

    def hook():
        loop = master.training.loop
        if not first_attempt or loop.epochs_done < after or not record.exists():
            return
        in_epoch = any(e == loop.epochs_done and row > 0 for e, row in loop.positions.values())
        if in_epoch and json.loads(record.read_bytes())["epochs_done"] == loop.epochs_done:
            os.kill(os.getpid(), signal.SIGKILL)
    return hook
"""

SPEC = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 12, "convergence_threshold": 1e-12,
        "checkpoint_every_epochs": 2, "audit_updates": True, "hparams": {"learning_rate": 0.5}}


@pytest.fixture(scope="module")
def recovery_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # A faulted job and the reference run side by side (an AM and four executors each; a faulted
    # job's two attempts overlap while the old one's containers are cleaned up).
    with running_cluster(tmp_path_factory.mktemp("am-recovery"), node_memory_mb=2560, node_vcores=4,
                         am_expiry_s=15) as c:
        yield c


@pytest.fixture(scope="module")
def reference(recovery_cluster: Any) -> str:
    """The unfaulted job both tests compare with, submitted once (it trains beside the first)."""
    return submit(recovery_cluster, "am-steady")


def submit(cluster: Any, name: str, hook: str | None = None, tmp_path: Path | None = None,
           environment: dict[str, str] | None = None, keep_containers: bool | None = None) -> str:
    sub = build_ps_submission({"executor_memory_mb": 320, **SPEC}, name=name, am_memory=384, max_app_attempts=2,
                              keep_containers=keep_containers)
    if hook is not None:
        assert tmp_path is not None
        use_scripted_am(sub, tmp_path, hook, environment)
    return submit_app(cluster.rm_url, sub)


def objectives_within_1pct_of_reference(cluster: Any, st: Any, reference: str) -> None:
    app = wait_app(cluster.rm_url, reference, ("FINISHED",), 240)
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    ref = final_status(cluster, reference)
    assert ref.resumed_from is None
    final, expected = st.objective_history[-1].objective, ref.objective_history[-1].objective
    assert final is not None and expected is not None
    assert abs(final - expected) <= 0.01 * abs(expected), (final, expected)


def attempt_containers(cluster: Any, app_id: str, attempt: int) -> list[int]:
    """Live processes of the job's containers in `attempt` (container ids carry the attempt)."""
    prefix = f"{container_env.CONTAINER_ID}=container_{app_id.split('_', 1)[1]}_{attempt:02d}_".encode()
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and any(e.startswith(prefix) for e in (d / "environ").read_bytes().split(b"\0")):
                out.append(int(d.name))
        except OSError:
            continue
    return out


def test_a_new_am_attempt_takes_the_failed_attempts_executors_over(recovery_cluster, reference,
                                                                    tmp_path: Path) -> None:
    cluster = recovery_cluster
    faulted = submit(cluster, "am-killed-adopt", KILL_MID_EPOCH, tmp_path, {FAULT_ENV: "4"})
    app = wait_app(cluster.rm_url, faulted, ("FINISHED",), 240)
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    attempts = rest(cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{faulted}/appattempts")["appAttempts"]["appAttempt"]
    assert len(attempts) == 2

    st = final_status(cluster, faulted)
    assert (st.attempt_id or "").endswith("_000002")
    taken = st.resumed_from
    assert taken is not None and taken.adopted and taken.executors_adopted == 4, taken
    assert taken.epoch >= 4 and (taken.attempt_id or "").endswith("_000001"), taken
    # The same executors trained on: every one in a container granted to attempt 1, none started anew.
    executors = st.shape.executors if st.shape else []
    first_attempt = f"container_{faulted.split('_', 1)[1]}_01_"
    assert len(executors) == 4 and all(e.container_id.startswith(first_attempt) for e in executors), executors
    history = st.objective_history
    assert [h.epoch for h in history] == list(range(12))        # one run of epochs, none redone or skipped
    assert st.eps is not None and st.eps.minibatches_applied == st.eps.minibatches_run
    assert not st.eps.audit_mismatches, st.eps.audit_mismatches
    objectives_within_1pct_of_reference(cluster, st, reference)
    wait_until(lambda: not pids_with_env(container_env.APP_ID, faulted), 30, "every process of the job gone")


def test_a_new_am_attempt_resumes_from_the_failed_attempts_checkpoint(recovery_cluster, reference,
                                                                      tmp_path: Path) -> None:
    cluster = recovery_cluster
    faulted = submit(cluster, "am-killed", KILL_AFTER_CHECKPOINT, tmp_path, {FAULT_ENV: "4"}, keep_containers=False)

    # Attempt 2 exists once the RM saw attempt 1's AM die; its executors are cleaned up meanwhile.
    wait_until(lambda: len(rest(cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{faulted}/appattempts")
                           ["appAttempts"]["appAttempt"]) == 2, 120, "a second attempt")
    wait_until(lambda: not attempt_containers(cluster, faulted, 1), 60, "attempt 1's processes gone")
    app = wait_app(cluster.rm_url, faulted, ("FINISHED",), 240)
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]

    st = final_status(cluster, faulted)
    assert (st.attempt_id or "").endswith("_000002")
    resumed = st.resumed_from
    assert resumed is not None and resumed.epoch >= 4 and (resumed.attempt_id or "").endswith("_000001"), resumed
    assert not resumed.adopted
    assert resumed.objective_restored == pytest.approx(resumed.objective, rel=1e-4)   # the model came back
    history = st.objective_history
    assert [h.epoch for h in history] == list(range(12))        # one run of epochs, none redone or skipped
    obj = [st.initial_objective] + [h.objective for h in history]
    assert None not in obj and st.initial_objective is not None, obj     # every objective finite
    assert obj[resumed.epoch + 1] < 1.02 * obj[resumed.epoch] < st.initial_objective, obj
    assert not st.eps or not st.eps.audit_mismatches
    objectives_within_1pct_of_reference(cluster, st, reference)
    for app_id in (faulted, reference):
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
