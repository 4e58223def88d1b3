"""Aggregated log retention (rm/log_retention.py, YARN's log-aggregation.retain-seconds): which
apps' logs go, on a local remote dir, an fsspec one and a real S3 server, and its settings."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from polling import async_wait_until, wait_until
from protocol.aggregated_logs import RemoteLogDir
from protocol.config import ClusterConfig, ConfigError, load
from protocol.records import Resource
from rm.__main__ import load_configs, parse_args
from rm.log_retention import expired, retention_pass
from rm.model import AmSpec
from rm.server import ResourceManagerServer

DAY = 86400.0
OLD, FRESH, RUNNING = "application_1_0001", "application_1_0002", "application_1_0003"


def test_an_over_app_whose_newest_file_is_past_retention_goes_a_running_or_newer_one_stays() -> None:
    ages = [(OLD, 0.0), (FRESH, 5 * DAY), (RUNNING, 0.0)]
    assert expired(ages, {RUNNING}, 7 * DAY + 1, 7 * DAY) == [OLD]
    assert expired(ages, {RUNNING}, 7 * DAY, 7 * DAY) == []          # not more than the retention yet
    assert expired(ages, set(), 13 * DAY, 7 * DAY) == [OLD, FRESH, RUNNING]
    assert expired(ages, set(), 100 * DAY, -1) == []                  # -1: keep them


def _app(root: Path, app: str, ages_s: list[float], now: float) -> None:
    d = root / app
    d.mkdir(parents=True)
    for i, age in enumerate(ages_s):
        f = d / f"10.0.0.{i}_8042"
        f.write_bytes(b"log")
        os.utime(f, (now - age, now - age))


def test_a_pass_on_a_local_dir_goes_by_the_newest_file_of_each_app(tmp_path: Path) -> None:
    now = time.time()
    root = tmp_path / "remote"
    _app(root, OLD, [9 * DAY, 8 * DAY], now)
    _app(root, FRESH, [9 * DAY, 1 * DAY], now)         # one node's file is recent: the app stays
    _app(root, RUNNING, [30 * DAY], now)
    store = RemoteLogDir(str(root))
    assert [a for a, _ in store.app_ages()] == [OLD, FRESH, RUNNING]
    assert dict(store.app_ages())[FRESH] == pytest.approx(now - DAY, abs=1)
    assert retention_pass(store, {RUNNING}, now, 7 * DAY) == [OLD]
    assert sorted(p.name for p in root.iterdir()) == [FRESH, RUNNING]
    assert retention_pass(store, {RUNNING}, now, 7 * DAY) == []        # nothing more to do
    assert RemoteLogDir(str(tmp_path / "never-written")).app_ages() == []


def test_a_pass_through_fsspec_lists_and_deletes_whole_app_dirs() -> None:
    store = RemoteLogDir(f"memory://retention-{os.getpid()}")
    store.write(OLD, "10.0.0.1_8042", [b"log"])
    store.write(OLD, "10.0.0.2_8042.roll000001", [b"log"])
    store.write(FRESH, "10.0.0.1_8042", [b"log"])
    written = dict(store.app_ages())
    assert set(written) == {OLD, FRESH} and abs(written[OLD] - time.time()) < 60
    assert retention_pass(store, {FRESH}, time.time() + 2 * DAY, DAY) == [OLD]
    assert store.names(OLD) == [] and store.names(FRESH) == ["10.0.0.1_8042"]
    store.remove_app(FRESH)


def test_a_pass_on_s3_reads_the_objects_times_and_deletes_the_app(s3: Any) -> None:
    store = RemoteLogDir(s3.url("app-logs"))
    store.write(OLD, "10.0.0.1_8042", [b"log"])
    store.write(FRESH, "10.0.0.1_8042", [b"log"])
    ages = dict(store.app_ages())
    assert set(ages) == {OLD, FRESH} and abs(ages[OLD] - time.time()) < 120    # S3's LastModified
    assert retention_pass(store, {FRESH}, time.time() + 2 * DAY, DAY) == [OLD]
    assert store.names(OLD) == [] and store.names(FRESH) == ["10.0.0.1_8042"]
    assert [a for a, _ in store.app_ages()] == [FRESH]      # nothing of OLD is left, not even a dir


def test_a_pass_on_s3_dates_an_app_by_the_files_there_now_not_by_an_earlier_passs_listing(s3: Any) -> None:
    """A pass lists a running app's rolls; its final file comes later, written by another process
    (an NM): the next pass dates the app by that file. With the listing of the first pass kept (s3fs
    caches a dir's listing, and invalidating the root leaves its children's), the app was dated by
    its old rolls and deleted -- final file and all -- as soon as it was over."""
    store = RemoteLogDir(s3.url("app-logs"))
    store.write(OLD, "10.0.0.1_8042.roll000001", [b"log"])
    rolled = dict(store.app_ages())[OLD]           # this pass lists OLD while it runs
    nm = s3.filesystem()
    final = s3.url("app-logs", OLD, "10.0.0.1_8042")

    def final_written_later() -> bool:             # S3 dates objects to the second: write until later
        nm.pipe_file(final, b"final log")
        return nm.info(final)["LastModified"].timestamp() > rolled
    wait_until(final_written_later, 30, "the final file dated after the roll", 0.2)
    written = nm.info(final)["LastModified"].timestamp()
    assert dict(store.app_ages())[OLD] == pytest.approx(written, abs=1e-3)
    assert retention_pass(store, set(), written + 0.5 * (written - rolled) + 0.01,
                          (written - rolled) * 0.75) == []       # past the roll's age, not the final's
    assert sorted(store.names(OLD)) == ["10.0.0.1_8042", "10.0.0.1_8042.roll000001"]


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_dir_not_named_for_an_app_is_neither_aged_nor_deleted(tmp_path: Path, where: str) -> None:
    """An operator's checkpoints (or anything else) under the same root are not the logs' to delete."""
    root = str(tmp_path / "remote") if where == "local" else f"memory://retention-other-{os.getpid()}"
    store = RemoteLogDir(root)
    store.write(OLD, "10.0.0.1_8042", [b"log"])
    store.write("checkpoints", "job.json", [b"{}"])             # as a checkpoint_dir on the same share
    store.write("application_1_1", "job.json", [b"{}"])         # not an app id's spelling either
    assert [a for a, _ in store.app_ages()] == [OLD]
    assert retention_pass(store, set(), time.time() + 2 * DAY, DAY) == [OLD]
    assert store.names("checkpoints") == ["job.json"] and store.names("application_1_1") == ["job.json"]
    store.remove_app("checkpoints")
    store.remove_app("application_1_1")


@pytest.mark.parametrize("lines, setting", [
    ('remote_app_log_dir = "/logs"\nremote_app_log_retain_s = 0', "remote_app_log_retain_s must be -1"),
    ('remote_app_log_dir = "/logs"\nremote_app_log_retain_s = -5', "remote_app_log_retain_s must be -1"),
    ('remote_app_log_dir = "/logs"\nremote_app_log_retain_check_s = -1', "remote_app_log_retain_check_s"),
    ('remote_app_log_retain_s = 86400', "remote_app_log_dir is empty"),
])
def test_bad_retention_settings_are_refused_naming_them(tmp_path: Path, lines: str, setting: str) -> None:
    f = tmp_path / "cluster.toml"
    f.write_text(f"[cluster]\n{lines}\n")
    with pytest.raises(ConfigError, match=setting):
        load(f, ClusterConfig, "cluster")


def test_the_check_interval_is_a_tenth_of_the_retention_at_least_a_minute_unless_set() -> None:
    assert ClusterConfig().log_retain_check_s == 0.0              # keep: no checks
    assert ClusterConfig(remote_app_log_dir="/l", remote_app_log_retain_s=7 * DAY).log_retain_check_s == pytest.approx(0.7 * DAY)
    assert ClusterConfig(remote_app_log_dir="/l", remote_app_log_retain_s=100).log_retain_check_s == 60.0
    assert ClusterConfig(remote_app_log_dir="/l", remote_app_log_retain_s=100,
                         remote_app_log_retain_check_s=5).log_retain_check_s == 5.0


async def test_the_rm_deletes_logs_past_retention_on_its_timer_but_not_a_running_apps(tmp_path: Path) -> None:
    now = time.time()
    remote = tmp_path / "remote"
    (tmp_path / "cluster.toml").write_text(
        f'[cluster]\nsecret = "test-secret-0123456789"\nremote_app_log_dir = "{remote}"\n'
        f'remote_app_log_retain_s = 86400\nremote_app_log_retain_check_s = 0.2\n')
    cfg, cluster = load_configs(parse_args(["--state-dir", str(tmp_path / "rm"), "--port", "0",
                                            "--cluster-config", str(tmp_path / "cluster.toml")]))
    rm = ResourceManagerServer(cfg, cluster)
    running = rm.core.new_application()
    rm.core.submit(running, "alice", "still-running", "default", "YARN", AmSpec(["true"], {}, {}, Resource(128, 1)), 1)
    _app(remote, running, [30 * DAY], now)
    _app(remote, OLD, [30 * DAY], now)         # an app this RM does not know (before its restart)
    _app(remote, FRESH, [3600.0], now)
    await rm.start()
    try:
        await async_wait_until(lambda: not (remote / OLD).exists(), 20, "the old app's logs deleted")
        assert sorted(p.name for p in remote.iterdir()) == sorted([running, FRESH])
    finally:
        await rm.stop()



def test_removing_an_app_dir_already_gone_is_no_error(tmp_path: Path) -> None:
    """Another RM's pass, or an operator, may delete the dir between the listing and the removal."""
    store = RemoteLogDir(str(tmp_path / "remote"))
    store.remove_app(OLD)
    assert store.app_ages() == []
