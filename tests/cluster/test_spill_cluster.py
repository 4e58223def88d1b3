"""End to end on a localhost cluster (RM + 3 NMs, cgroup memory limits): a PS job whose worker's input
is larger than its container's memory is killed with -104 without spill, and finishes with
`spill_alpha: "auto"` -- the worker keeps most of its blocks on disk, and the job's report shows
its alpha and the megabytes spilled."""
from __future__ import annotations

from typing import Any

import pytest

from appmaster.ps.submission import build_ps_submission
from conftest import get_app, kill_unless_final, pids_with_env, submit_app, wait_app
from polling import wait_until
from protocol import container_env
from test_cluster_limits import cgroups_unusable_reason

pytestmark = pytest.mark.cluster

EXECUTOR_MB = 160
# ~165 MB of input on the one worker (412 bytes a sample): more than its 160 MB container holds
# beside the executor's own ~75 MB, in 40 blocks of ~4 MB so that most of it can sit on disk.
SPEC: dict[str, Any] = {"app": "mlr", "preset": "tiny", "workers": 1, "servers": 1, "max_epochs": 1,
                        "executor_memory_mb": EXECUTOR_MB, "heldout_every_epochs": 0,
                        "data": {"num_samples": 400_000, "rows_per_block": 10_000, "num_features": 1000,
                                 "nnz_per_sample": 50, "num_heldout": 500},
                        "hparams": {"batch_size": 2000}}


def _run(cluster: Any, spec: dict[str, Any], name: str) -> tuple[dict[str, Any], str]:
    app_id = submit_app(cluster.rm_url, build_ps_submission(spec, name=name, am_memory=384))
    try:
        app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 150)
    finally:
        kill_unless_final(cluster.rm_url, app_id)
        wait_until(lambda: not pids_with_env(container_env.APP_ID, app_id), 30, "every process of the job gone")
    return app, app_id


def test_a_job_larger_than_its_containers_finishes_with_spill_and_is_killed_without(cluster: Any) -> None:
    reason = cgroups_unusable_reason()
    if reason:
        pytest.skip(reason)
    app, _ = _run(cluster, SPEC, "no-spill")
    assert app["finalStatus"] == "FAILED"
    assert "exited with -104 (KILLED_EXCEEDED_PMEM)" in app["diagnostics"], app["diagnostics"]

    app, app_id = _run(cluster, {**SPEC, "spill_alpha": "auto"}, "spill")
    assert app["finalStatus"] == "SUCCEEDED", app["diagnostics"]
    report = get_app(cluster.rm_url, app_id)["shape"]      # the AM's last job report
    # The input cannot all stay in memory: a good part of it is on disk (the tuner keeps the
    # container's charge under 70 % of its limit, about half the blocks here).
    assert report["alpha"] is not None and 0.25 <= report["alpha"] <= 1.0, report
    assert report["spilled_mb"] > 25, report


def test_a_process_in_a_memory_limited_cgroup_reads_its_charge_and_limit_not_its_rss(tmp_path: Any) -> None:
    # What the spill tuner reads (psruntime/spill/memory_reading.py), in a real cgroup made as
    # the NM makes a container's: 64 MB touched in it is charged there, and the limit is found.
    import os
    import subprocess
    import sys
    from pathlib import Path

    from nodemanager.cgroup_detect import CgroupVersion, detect_from_file

    reason = cgroups_unusable_reason()
    if reason:
        pytest.skip(reason)
    layout = detect_from_file()
    if layout.version is CgroupVersion.V1:
        mount, limit_file = layout.v1_mounts.get("memory"), "memory.limit_in_bytes"
    else:
        mount, limit_file = layout.v2_mount, "memory.max"
        if mount and "memory" not in Path(mount, "cgroup.subtree_control").read_text().split():
            pytest.skip("the cgroup2 root does not delegate the memory controller")
    if not mount:
        pytest.skip("no memory controller mounted")
    cg = Path(mount) / f"elastane-spill-test-{os.getpid()}"
    cg.mkdir()
    try:
        (cg / limit_file).write_text(str(256 * 2**20))
        script = ("import os, sys\n"
                  "open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid()))\n"
                  "from psruntime.spill.memory_reading import ContainerMemory\n"
                  "m = ContainerMemory()\n"
                  "before = m.used_bytes()\n"
                  "b = bytearray(64 * 2**20)\n"
                  "for i in range(0, len(b), 4096): b[i] = 1\n"
                  "print(m.source, m.limit_bytes(), before, m.used_bytes())\n")
        out = subprocess.run([sys.executable, "-c", script, str(cg)], capture_output=True, text=True, timeout=60,
                             cwd=Path(__file__).resolve().parents[2], check=True).stdout.split()
    finally:
        # The child has exited: its cgroup is empty and can go.
        cg.rmdir()
    source, limit, before, after = out[0] + " " + out[1], int(out[2]), int(out[3]), int(out[4])
    assert source.startswith("cgroup") and limit == 256 * 2**20, out
    # Only what the process touched after it joined is charged there (not its interpreter's RSS).
    assert after - before >= 60 * 2**20 and before < 32 * 2**20, out
