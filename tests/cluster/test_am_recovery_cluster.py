"""A new AM attempt resumes a PS job from the checkpoint the failed attempt left (RM + 3 NMs).

An MLR job (2 workers, 2 servers, checkpoints every 2 epochs, 2 attempts allowed) runs under the
PS AM plus a fault script: in the first attempt only, the AM SIGKILLs itself right after the
checkpoint of epoch 4 is on disk -- a crashed AM host, at a point that does not depend on how fast
the machine is. The RM sees the AM container end, fails the attempt, cleans up its executors and
starts attempt 2, which finds the checkpoint in the job's durable AM dir and continues from it.
Checked: the job SUCCEEDS in attempt 2, which resumed from epoch 4 (not epoch 0); the objective
history is one contiguous run of epochs with no jump back to the untrained objective; the first
attempt's executors were gone while the second trained; and the final objective is within 1 % of
the same job trained without a fault beside it.
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
        if first_attempt and any(c["epoch"] >= after for c in master.checkpointer.written):
            os.kill(os.getpid(), signal.SIGKILL)
    return hook
"""


@pytest.fixture(scope="module")
def recovery_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # The faulted job and its reference run side by side (an AM and four executors each).
    with running_cluster(tmp_path_factory.mktemp("am-recovery"), node_memory_mb=2048, node_vcores=4,
                         am_expiry_s=15) as c:
        yield c


def submit(cluster: Any, spec: dict[str, Any], name: str, tmp_path: Path, kill_after: int | None) -> str:
    sub = build_ps_submission({"executor_memory_mb": 320, **spec}, name=name, am_memory=384, max_app_attempts=2)
    if kill_after is not None:
        use_scripted_am(sub, tmp_path, KILL_AFTER_CHECKPOINT, {FAULT_ENV: str(kill_after)})
    return submit_app(cluster.rm_url, sub)


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


def test_a_new_am_attempt_resumes_from_the_failed_attempts_checkpoint(recovery_cluster, tmp_path: Path) -> None:
    cluster = recovery_cluster
    spec = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 12, "convergence_threshold": 1e-12,
            "checkpoint_every_epochs": 2, "hparams": {"learning_rate": 0.5}}
    faulted = submit(cluster, spec, "am-killed", tmp_path, kill_after=4)
    steady = submit(cluster, spec, "am-steady", tmp_path, kill_after=None)

    # Attempt 2 exists once the RM saw attempt 1's AM die; its executors are cleaned up meanwhile.
    wait_until(lambda: len(rest(cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{faulted}/appattempts")
                           ["appAttempts"]["appAttempt"]) == 2, 120, "a second attempt")
    wait_until(lambda: not attempt_containers(cluster, faulted, 1), 60, "attempt 1's processes gone")
    for app_id in (faulted, steady):
        app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 240)
        assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]

    st, ref = final_status(cluster, faulted), final_status(cluster, steady)
    assert (st.attempt_id or "").endswith("_000002") and ref.resumed_from is None
    resumed = st.resumed_from
    assert resumed is not None and resumed.epoch >= 4 and (resumed.attempt_id or "").endswith("_000001"), resumed
    assert resumed.objective_restored == pytest.approx(resumed.objective, rel=1e-4)   # the model came back
    history = st.objective_history
    assert [h.epoch for h in history] == list(range(12))        # one run of epochs, none redone or skipped
    obj = [st.initial_objective] + [h.objective for h in history]
    assert None not in obj and st.initial_objective is not None, obj     # every objective finite
    assert obj[resumed.epoch + 1] < 1.02 * obj[resumed.epoch] < st.initial_objective, obj
    final, expected = obj[-1], ref.objective_history[-1].objective
    assert final is not None and expected is not None
    assert abs(final - expected) <= 0.01 * abs(expected), (final, expected)
    for app_id in (faulted, steady):
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
