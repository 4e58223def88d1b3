"""A PS job survives a crashed host: the NM and every container process on it SIGKILLed.

Four nodes. An MLR job (2 workers, 2 servers, checkpoints every 2 epochs, the exactly-once audit
on) first trains undisturbed as the reference. The same job then runs under the PS AM plus a small
script that, once epoch 3 is done, holds the AM still for a moment (it blocks its event loop
until the test says go, well within the AM's expiry) so the test can crash a node hosting some of
its executors but not its AM at a point that does not depend on how fast the host is. The RM
declares the node LOST after its expiry and reports the containers -100 (ABORTED); the AM replaces
them on the surviving nodes. What else it does depends on what the node hosted: only workers, and
their replacements go on from where their splits stood (no epoch redone); a server among them, and
every executor is replaced and the job goes back to the latest checkpoint. Checked: the job
SUCCEEDS after one recovery of the kind that matches, whose record names the executors lost with
-100, none of its executors at the end ran on the lost node, the epochs form one contiguous run,
the audit is exact, and the final objective is within 1 % of the reference.
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import get_app, pids_with_env, running_cluster, submit_app, wait_app
from polling import wait_until
from ps_am_status import final_status
from protocol import container_env
from protocol.shape_history import RecoveryChange, ReplaceWorkerChange
from scripted_am import use_scripted_am
from test_cluster_node_loss import remove_leftover_cgroups

pytestmark = pytest.mark.cluster

PAUSE_ENV = "ELASTANE_TEST_PAUSE_DIR"

# Once epoch 3 is done the AM writes <dir>/paused with the live executors and blocks until <dir>/go
# exists (at most 10 s: below the AM expiry the test's cluster uses).
PAUSE = f"""
def make_hook(master, am):
    d = Path(os.environ["{PAUSE_ENV}"])
    done = []

    def hook():
        if not done and master.training.loop.epochs_done >= 3:
            done.append(True)
            import msgspec
            (d / "paused").write_text(json.dumps([msgspec.to_builtins(e.status()) for e in master.pool.live()]))
            deadline = time.monotonic() + 10
            while not (d / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.02)   # holding the AM still is the point here
    return hook
"""

SPEC = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 12, "convergence_threshold": 1e-12,
        "checkpoint_every_epochs": 2, "audit_updates": True, "executor_memory_mb": 320,
        "hparams": {"learning_rate": 0.5}}


@pytest.fixture
def four_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # Destructive: a cluster of its own. Each node takes two executors besides an AM.
    with running_cluster(tmp_path_factory.mktemp("node-loss-recovery"), nodes=4, node_memory_mb=1280,
                         node_vcores=3, am_expiry_s=20) as c:
        yield c


def test_a_crashed_host_costs_the_job_a_recovery_not_its_life(four_nodes, tmp_path: Path) -> None:
    c = four_nodes
    reference = submit_app(c.rm_url, build_ps_submission(SPEC, name="undisturbed", am_memory=384))
    assert wait_app(c.rm_url, reference, ("FINISHED",), 240)["finalStatus"] == "SUCCEEDED"

    sub = use_scripted_am(build_ps_submission(SPEC, name="host-crash", am_memory=384), tmp_path, PAUSE,
                          {PAUSE_ENV: str(tmp_path)})
    app_id = submit_app(c.rm_url, sub)
    victim = None
    try:
        live = wait_until(lambda: (tmp_path / "paused").exists() and json.loads((tmp_path / "paused").read_text()),
                          120, "the AM paused after epoch 3")
        am_node = get_app(c.rm_url, app_id)["amHostHttpAddress"]
        victim = next(n for n in c.nodes if n.http_address != am_node and any(e["node"] == n.node_id for e in live))
        doomed = [e for e in live if e["node"] == victim.node_id]
        c.kill_node(victim.index)                                   # the host crashes: NM ...
        for e in doomed:                                            # ... and every container on it
            for pid in pids_with_env(container_env.CONTAINER_ID, e["container_id"]):
                os.kill(pid, signal.SIGKILL)
        (tmp_path / "go").touch()
        app = wait_app(c.rm_url, app_id, ("FINISHED",), 240)
        assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    finally:
        (tmp_path / "go").touch()
        if victim is not None:
            c.stop()
            remove_leftover_cgroups(victim.node_id)

    st, ref = final_status(c, app_id), final_status(c, reference)
    rec = [h for h in st.shape_history if isinstance(h, (RecoveryChange, ReplaceWorkerChange))]
    assert st.recovery is not None and st.recovery.failures == 1, st.recovery
    assert len(rec) == 1 and rec[0].error == "", st.shape_history
    servers_lost = any(e["role"] == "server" for e in doomed)
    assert type(rec[0]) is (RecoveryChange if servers_lost else ReplaceWorkerChange), (doomed, rec[0])
    assert servers_lost or rec[0].epochs_redone == 0, rec[0]
    assert all("exited with -100" in lost for lost in rec[0].lost), rec[0].lost
    assert {e["id"] for e in doomed} == {lost.split(" ")[0] for lost in rec[0].lost}, rec[0].lost
    assert st.shape is not None
    serving = [e for e in st.shape.executors if e.state in ("READY", "EXITED") and
               e.id not in {x["id"] for x in live}]
    # Every executor is new after a checkpoint recovery; only the lost workers' replacements otherwise.
    assert len(serving) == (4 if servers_lost else len(doomed)), serving
    assert all(e.node != victim.node_id for e in serving), serving
    assert [h.epoch for h in st.objective_history] == list(range(12))
    assert st.eps is not None and st.eps.audit_mismatches == []
    final, expected = st.objective_history[-1].objective, ref.objective_history[-1].objective
    assert final is not None and expected is not None
    assert abs(final - expected) <= 0.01 * abs(expected), (final, expected)
