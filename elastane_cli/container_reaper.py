"""Kill container processes that NMs recorded in their recovery dirs and left behind.

An NM killed with SIGKILL (a simulated host crash) leaves its containers running, as a crashed
host's NM would. When the local cluster stops, those processes must go too, but only those. A
process is killed only if it started after the cluster did and either
- is in the recorded process group while the group's leader is still the recorded process (its pid
  and start time, as recorded): the container's own session, unless its environment names another
  container; or
- carries the recorded CONTAINER_ID in its environment (a member left behind by a leader that
  exited, in the recorded group or the recorded pid).
A recorded pid that now names another process, or a group led by one, is not signalled: the
number was reused, and its processes are someone else's.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodemanager import procfs
from nodemanager.cgroup_base import sanitise
from nodemanager.recovery_store import read_records
from protocol import container_env

from . import processes


CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class RecordedContainer:
    """A container process an NM wrote down in its recovery dir."""

    pid: int
    pgid: int
    container_id: str = ""
    start_ticks: int | None = None


def _recorded(record: dict[str, Any]) -> RecordedContainer | None:
    """The process one container record names (nodemanager.container.Container.to_record: `pid`,
    `pgid`, and `start_time` in clock ticks since boot), or None when it names none."""
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 1:
        return None
    pgid = record.get("pgid")
    ticks = record.get("start_time")
    return RecordedContainer(
        pid=pid,
        pgid=pgid if isinstance(pgid, int) and pgid > 1 else pid,  # own session: pgid == pid
        container_id=str(record.get("container_id") or ""),
        start_ticks=ticks if isinstance(ticks, int) else None,
    )


def recorded_containers(recovery_dir: Path) -> list[RecordedContainer]:
    """Every container an NM's recovery records hold (nodemanager.recovery_store.read_records:
    its journal replayed, so a container whose completion the RM saw is not among them)."""
    found: dict[tuple[int, str], RecordedContainer] = {}
    for record in read_records(recovery_dir).values():
        rec = _recorded(record)
        if rec is not None:
            found[(rec.pid, rec.container_id)] = rec
    return list(found.values())


def _leader_is_recorded(rec: RecordedContainer) -> bool:
    """The recorded pid still runs the recorded process (start time known and the same)."""
    return rec.start_ticks is not None and processes.is_alive(rec.pid, rec.start_ticks)


def _belongs(pid: int, rec: RecordedContainer, not_before_unix: float, leader_is_recorded: bool) -> bool:
    ticks = processes.proc_start_ticks(pid)
    if ticks is None:
        return False
    if pid == rec.pid and rec.start_ticks is not None and ticks != rec.start_ticks:
        return False  # the recorded pid was recycled
    # Started before the cluster: certainly not one of its containers. 1 s slack for rounding.
    if processes.ticks_to_unix(ticks) < not_before_unix - 1.0:
        return False
    cid = procfs.environ(pid).get(container_env.CONTAINER_ID)
    if rec.container_id and cid is not None and cid != rec.container_id:
        return False      # another container's process
    if leader_is_recorded:
        return True       # the container's own session (module doc)
    # No leader to vouch for it: only its environment can say it is the container's.
    return bool(rec.container_id) and cid == rec.container_id


def reap(recovery_dirs: list[Path], not_before_unix: float) -> list[int]:
    """SIGKILL the live processes of every recorded container; return the pids killed."""
    killed: list[int] = []
    for rec in (r for d in recovery_dirs for r in recorded_containers(d)):
        leader = _leader_is_recorded(rec)
        members = set(processes.group_members(rec.pgid))
        if processes.is_alive(rec.pid):
            members.add(rec.pid)
        for pid in sorted(members):
            if _belongs(pid, rec, not_before_unix, leader) and processes.signal_pid(pid, signal.SIGKILL):
                killed.append(pid)
    processes.wait_gone([(p, None) for p in killed], 5.0)
    for d in recovery_dirs:
        remove_recorded_cgroups(d)
    return killed


def _recorded_cgroup_dirs(record: dict[str, Any]) -> list[str]:
    """The cgroup dirs one container record names (its `cgroup`'s `dirs`)."""
    cg = record.get("cgroup")
    dirs = cg.get("dirs") if isinstance(cg, dict) else None
    return [str(d) for d in dirs] if isinstance(dirs, list) else []


def remove_recorded_cgroups(recovery_dir: Path, cgroup_root: str = CGROUP_ROOT) -> list[str]:
    """Remove the (now empty) cgroup dirs of containers a dead NM recorded; an NM killed with
    SIGKILL cannot remove them itself. Only dirs named after a container under `cgroup_root`."""
    removed: list[str] = []
    for record in read_records(recovery_dir).values():
        for d in _recorded_cgroup_dirs(record):
            p = Path(d)
            if not p.name.startswith("container_") or not str(p).startswith(cgroup_root.rstrip("/") + "/"):
                continue
            try:
                p.rmdir()  # fails (and is skipped) while a process is still in it
                removed.append(d)
                p.parent.rmdir()  # the NM's per-node dir, once its last container is gone
            except OSError:
                pass
    return removed


def remove_node_cgroup_dirs(node_ids: list[str], cgroup_name: str = "elastane",
                            root: Path = Path(CGROUP_ROOT)) -> list[str]:
    """Remove the (empty) per-node cgroup dirs NMs of this cluster leave when they die without a
    clean shutdown; rmdir refuses a dir that still has containers, so nothing live is touched."""
    removed: list[str] = []
    for node_id in node_ids:
        name = sanitise(node_id)
        for d in [*root.glob(f"*/{cgroup_name}/{name}"), root / cgroup_name / name]:
            # Its pre-started shells' cgroups first (nodemanager.container_shell_pool): the shells
            # exit when their NM goes, but the dirs stay and keep the node's dir from going.
            for shell in d.glob("shell-*"):
                try:
                    shell.rmdir()
                    removed.append(str(shell))
                except OSError:
                    pass
            try:
                d.rmdir()
                removed.append(str(d))
            except OSError:
                pass
    return removed

