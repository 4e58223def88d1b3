"""S3 against local storage for what PS jobs keep there: a checkpoint written and read, and an
archive localized, through the project's own code, on a real S3 server in the same run.

    .venv/bin/python bench/storage.py [--repeats 5] [--checkpoint-mib 100] [--archive-mb 50] [--quick]

One SeaweedFS server (`weed mini`, the tests' tests/support/s3_server.py) on loopback, its data
dir beside the local baseline's, on the same disk. Each comparison changes only where the bytes go:

checkpoint  In-process PS servers (two executors on loopback sockets, the real data plane) hold a
            model of --checkpoint-mib MiB. write: appmaster.ps.checkpoints.Checkpointer.write
            into a durable dir -- a local dir (each file fsynced, job.json renamed in last) or an
            s3:// URL (the same files staged on local disk, then put, job.json last). read: a new
            Checkpointer, as a new AM attempt on another host with its own staging dir, finds the
            latest checkpoint (`latest`), fetches it (`fetch`: a download for S3, nothing for a
            local dir) and restores it onto the servers (`restore`); the restored model is checked
            against the one written. One sample = write + read.
localize    nodemanager.localizer.fetch of a --archive-mb MB tar.gz (random bytes in 5 MB files,
            bench/localization.py's archive) as an ARCHIVE resource: from file:// (unpacked where
            it is) and from s3:// (downloaded, then unpacked); the unpacked bytes are checked.

Each repeat runs the local and the S3 sample back to back, alternating which goes first, after
--warmup untimed rounds (the S3 client's first connections, SeaweedFS's first volumes). The
ratios are of the medians over the repeats: `s3_checkpoint_over_local` (target <= 3) and
`s3_localize_over_file` (target <= 2); each series' min / median / max and the per-repeat ratios'
range give the spread. A sample that fails is counted in `failures`, not timed. `--quick`: 16 MiB,
10 MB and 2 repeats, only to check the bench runs. The machine's load average at the start and the
end is recorded with the figures: on a busy machine the figures are that machine's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
# The S3 server and the in-process executors are test support (tests/support/), not product code.
sys.path.insert(0, str(ROOT / "tests" / "support"))
from support.sigterm import unwind_on_sigterm  # noqa: E402  (bench/support: not a benchmark itself)
from localization import make_archive  # noqa: E402  (bench/localization.py's archive, the same bytes)

import s3_server  # noqa: E402
from store_cluster import executor_cluster, pull_values, put_values, server_record  # noqa: E402
from appmaster.ps.checkpoints import Checkpointer  # noqa: E402
from appmaster.ps.runtime.executor_pool import ExecutorRecord  # noqa: E402
from nodemanager import localizer  # noqa: E402
from protocol import ps_job_spec  # noqa: E402
from protocol.checkpoint_manifest import JobRecord  # noqa: E402
from protocol.ps_status import EpochResult  # noqa: E402
from protocol.local_resources import LocalResource  # noqa: E402

NUM_BLOCKS = 16
SERVERS = 2
VALUE_FLOATS = 4096          # one key's value: 16 KiB of float32
TARGETS = {"s3_checkpoint_over_local": 3.0, "s3_localize_over_file": 2.0}


class Failure(Exception):
    """A sample that did not do what it should (its figure is not used)."""


def _job_record() -> JobRecord:
    """The job fields a checkpoint's job.json carries (what the AM's master.job_record gives)."""
    spec = ps_job_spec.validate({"app": "mlr", "workers": 1, "servers": SERVERS})
    return JobRecord(spec=spec, attempt_id="appattempt_1_0001_000001", initial_objective=1.0,
                     objective_history=[EpochResult(epoch=0, objective=0.5, epoch_time_s=1.0, time=1.0)],
                     iterations=1, clocks=1, minibatches_run=1)


def stats(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "min": None, "median": None, "max": None}
    return {"n": len(values), "min": round(min(values), 4), "median": round(statistics.median(values), 4),
            "max": round(max(values), 4)}


def ratio(num: Sequence[float], den: Sequence[float]) -> float | None:
    return round(statistics.median(num) / statistics.median(den), 3) if num and den else None


def pair_ratios(num: Sequence[float], den: Sequence[float]) -> dict[str, float | None]:
    """The range of the per-repeat ratios (samples of one repeat ran back to back)."""
    r = [a / b for a, b in zip(num, den) if b > 0]
    return {"min": round(min(r), 3) if r else None, "max": round(max(r), 3) if r else None}


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, server: s3_server.S3Server, bucket: str) -> None:
        self.args, self.work, self.server, self.bucket = args, work, server, bucket
        self.times: dict[str, list[float]] = {"ckpt_local": [], "ckpt_s3": [], "ckpt_local_write": [],
                                              "ckpt_s3_write": [], "ckpt_local_read": [], "ckpt_s3_read": [],
                                              "loc_file": [], "loc_s3": []}
        self.failures: dict[str, list[str]] = {}
        self.cpu_s: dict[str, list[float]] = {}    # CPU seconds of the writes: where the time goes
        self.checkpoint_bytes = 0
        self.fs = server.filesystem()      # the bench's own client, for setting up and cleaning up

    def failed(self, what: str, e: BaseException) -> None:
        self.failures.setdefault(what, []).append(f"{type(e).__name__}: {e}")
        print(f"  {what}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)

    # ----- checkpoints ------------------------------------------------------------------------------

    async def checkpoints(self) -> None:
        keys = int(self.args.checkpoint_mib * 2**20) // (4 * VALUE_FLOATS)
        rng = np.random.default_rng(0)
        model = {k: rng.standard_normal(VALUE_FLOATS, dtype=np.float32) for k in range(keys)}
        async with executor_cluster(SERVERS, NUM_BLOCKS) as (executors, ctl, dp):
            await put_values(ctl, model)
            records = [server_record(e, i) for i, e in enumerate(executors)]
            for i in range(-self.args.warmup, self.args.repeats):
                order = ("local", "s3") if i % 2 == 0 else ("s3", "local")
                for where in order:
                    try:
                        await self.checkpoint_sample(where, i, ctl, dp, records, model)
                    except Exception as e:  # noqa: BLE001 - counted apart, the run goes on
                        self.failed(f"checkpoint_{where}", e)

    async def checkpoint_sample(self, where: str, i: int, ctl: Any, dp: Any, records: list[ExecutorRecord],
                                model: dict[int, np.ndarray]) -> None:
        run = f"ckpt-{where}-{i}"
        durable = (str(self.work / "local" / run) if where == "local"
                   else s3_server.S3Server.url(self.bucket, run))
        try:
            writer = Checkpointer(durable, dp, staging=self.work / "stage-a" / run)
            cpu0 = self.cpu()
            t0 = time.perf_counter()
            info = await writer.write(1, ctl.table, records, _job_record())
            t1 = time.perf_counter()
            cpu1 = self.cpu()
            await self.put_sample(ctl, model, zero=True)    # only a real restore brings these back
            t2 = time.perf_counter()
            reader = Checkpointer(durable, dp, staging=self.work / "stage-b" / run)   # attempt 2, elsewhere
            latest = reader.latest()
            if latest is None:
                raise Failure(f"no checkpoint found in {durable}")
            fetched = await reader.fetch(latest)
            await reader.restore(fetched.dir, records, NUM_BLOCKS)
            t3 = time.perf_counter()
        finally:
            await asyncio.to_thread(self.remove_run, where, run)
        try:
            await self.check_sample(ctl, model)
        finally:
            await self.put_sample(ctl, model, zero=False)
        write_s, read_s = t1 - t0, t3 - t2
        self.checkpoint_bytes = info.bytes
        if i < 0:
            print(f"  checkpoint {where:5s} warm-up: write {write_s:7.3f} s  read {read_s:7.3f} s  (not counted)")
            return
        self.times[f"ckpt_{where}"].append(write_s + read_s)
        self.times[f"ckpt_{where}_write"].append(write_s)
        self.times[f"ckpt_{where}_read"].append(read_s)
        client_cpu, server_cpu = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        self.cpu_s.setdefault(f"ckpt_{where}_write_client", []).append(client_cpu)
        if where == "s3":
            self.cpu_s.setdefault("ckpt_s3_write_server", []).append(server_cpu)
        print(f"  checkpoint {where:5s} #{i}: write {write_s:7.3f} s  read {read_s:7.3f} s  "
              f"({info.bytes / 2**20:.1f} MiB; write CPU: this process {client_cpu:.2f} s, "
              f"S3 server {server_cpu:.2f} s)")

    def cpu(self) -> tuple[float, float]:
        """(this process's, the S3 server's) CPU seconds so far."""
        t = os.times()
        return t.user + t.system, self.server.cpu_seconds()

    def remove_run(self, where: str, run: str) -> None:
        for d in ("stage-a", "stage-b", "local"):
            shutil.rmtree(self.work / d / run, ignore_errors=True)
        if where == "s3" and self.fs.exists(f"{self.bucket}/{run}"):
            self.fs.rm(f"{self.bucket}/{run}", recursive=True)

    @staticmethod
    def sample_keys(model: dict[int, np.ndarray]) -> list[int]:
        return list(model)[:: max(1, len(model) // 64)]

    async def put_sample(self, ctl: Any, model: dict[int, np.ndarray], zero: bool) -> None:
        """Overwrite the sample keys with zeros (`zero`), or put their true values back."""
        await put_values(ctl, {k: np.zeros_like(model[k]) if zero else model[k] for k in self.sample_keys(model)})

    async def check_sample(self, ctl: Any, model: dict[int, np.ndarray]) -> None:
        keys = self.sample_keys(model)
        got = await pull_values(ctl, keys)
        for k in keys:
            if not np.array_equal(got[k], model[k]):
                raise Failure(f"key {k} differs after the restore")

    # ----- localization -----------------------------------------------------------------------------

    def localization(self) -> None:
        archive = self.work / "archive.tgz"
        make_archive(archive, self.args.archive_mb)
        key = f"{self.bucket}/resources/{archive.name}"
        self.fs.put_file(str(archive), key)
        sources = {"file": f"file://{archive}", "s3": f"s3://{key}"}
        want = self.args.archive_mb * 2**20
        for i in range(-self.args.warmup, self.args.repeats):
            order = ("file", "s3") if i % 2 == 0 else ("s3", "file")
            for where in order:
                target = self.work / f"unpacked-{where}-{i}"
                try:
                    t0 = time.perf_counter()
                    localizer.fetch(LocalResource(sources[where], type="ARCHIVE"), str(target))
                    dt = time.perf_counter() - t0
                    got = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
                    if got != want:
                        raise Failure(f"unpacked {got} bytes, the archive holds {want}")
                    if i < 0:
                        print(f"  localize   {where:5s} warm-up: {dt:7.3f} s (not counted)")
                        continue
                    self.times[f"loc_{where}"].append(dt)
                    print(f"  localize   {where:5s} #{i}: {dt:7.3f} s")
                except Exception as e:  # noqa: BLE001 - counted apart, the run goes on
                    self.failed(f"localize_{where}", e)
                finally:
                    shutil.rmtree(target, ignore_errors=True)

    # ----- figures ----------------------------------------------------------------------------------

    def figures(self, load: list[float], elapsed: float) -> dict[str, Any]:
        t = self.times
        out: dict[str, Any] = {
            "s3_checkpoint_over_local": ratio(t["ckpt_s3"], t["ckpt_local"]),
            "s3_localize_over_file": ratio(t["loc_s3"], t["loc_file"]),
            "targets": {k: f"<= {v}" for k, v in TARGETS.items()},
            "s3_checkpoint_write_over_local": ratio(t["ckpt_s3_write"], t["ckpt_local_write"]),
            "s3_checkpoint_read_over_local": ratio(t["ckpt_s3_read"], t["ckpt_local_read"]),
            "per_repeat_ratio_range": {"checkpoint": pair_ratios(t["ckpt_s3"], t["ckpt_local"]),
                                       "localize": pair_ratios(t["loc_s3"], t["loc_file"])},
            "seconds": {k: stats(v) for k, v in t.items()},
            "cpu_seconds": {k: stats(v) for k, v in self.cpu_s.items()},
            "failures": {k: len(v) for k, v in self.failures.items()},
            "checkpoint_mib": round(self.checkpoint_bytes / 2**20, 2), "archive_mb": self.args.archive_mb,
            "repeats": self.args.repeats, "warmup_rounds": self.args.warmup, "quick": self.args.quick,
            "load_average_1m": [round(x, 2) for x in load], "cpus": os.cpu_count(),
            "elapsed_s": round(elapsed, 1),
        }
        print(f"checkpoint ({out['checkpoint_mib']} MiB, write + read), median of {self.args.repeats}:")
        print(f"  local {stats(t['ckpt_local'])['median']} s   S3 {stats(t['ckpt_s3'])['median']} s   "
              f"S3 / local = {out['s3_checkpoint_over_local']} (target <= 3)")
        server = stats(self.cpu_s.get("ckpt_s3_write_server", []))["median"]
        print(f"  the S3 server's CPU per checkpoint write: {server} s (median)")
        print(f"localize ({self.args.archive_mb} MB archive), median of {self.args.repeats}:")
        print(f"  file:// {stats(t['loc_file'])['median']} s   S3 {stats(t['loc_s3'])['median']} s   "
              f"S3 / file = {out['s3_localize_over_file']} (target <= 2)")
        print(f"load average {load[0]:.2f} at the start, {load[-1]:.2f} at the end, {os.cpu_count()} CPUs")
        return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="samples of each series (default 5)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed rounds first (default 1): the S3 client's connections, the server's first volumes")
    p.add_argument("--checkpoint-mib", type=float, default=100.0, help="the model's size (default 100 MiB)")
    p.add_argument("--archive-mb", type=int, default=50, help="the archive's size (default 50 MB)")
    p.add_argument("--quick", action="store_true", help="16 MiB, 10 MB, 2 repeats: only checks the bench runs")
    p.add_argument("--work-dir", default=None, help="where the temp dir goes (default: the system's)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.checkpoint_mib, args.archive_mb = 2, 16.0, 10
    if args.repeats < 1 or args.checkpoint_mib <= 0 or args.archive_mb < 1 or args.warmup < 0:
        p.error("--repeats, --checkpoint-mib and --archive-mb must be positive, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    unwind_on_sigterm()   # a SIGTERM still stops the S3 server this bench started
    args = parse_args(sys.argv[1:] if argv is None else argv)
    reason = s3_server.unavailable_reason()
    if reason is not None:
        print(f"storage: {reason}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="elastane-bench-storage-", dir=args.work_dir))
    started = time.monotonic()
    server = s3_server.start_s3_server(work / "s3")
    try:
        os.environ.update(server.env)      # what a cluster's processes get from [storage]
        s3_server.forget_cached_filesystems()
        bench = Bench(args, work, server, server.create_bucket())
        load = [os.getloadavg()[0]]
        asyncio.run(bench.checkpoints())
        bench.localization()
        load.append(os.getloadavg()[0])
        figures = bench.figures(load, time.monotonic() - started)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures))
    return 0 if figures["s3_checkpoint_over_local"] is not None and figures["s3_localize_over_file"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
