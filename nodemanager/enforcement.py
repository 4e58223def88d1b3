"""Choose how the NM enforces container limits: a cgroup backend, or the RSS monitor fallback."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .cgroup_base import CgroupBackend, CgroupError, sanitise
from .cgroup_detect import CgroupVersion, detect_from_file
from .cgroup_v1 import CgroupV1
from .cgroup_v2 import CgroupV2


@dataclass
class Enforcement:
    """The outcome: `backend` is None when cgroups cannot be used, and `warning` says why."""

    backend: Optional[CgroupBackend]
    warning: Optional[str] = None
    favor_dynmods: Optional[bool] = None   # cgroup_detect.favors_dynamic_mods of this host

    @property
    def mode(self) -> str:
        return self.backend.version if self.backend else "rss-monitor"


def choose(mode: str, node_id: str, cgroup_name: str, cpu_period_us: int, hard_cpu: bool,
           mounts_file: str = "/proc/mounts", cores_per_vcore: float = 1.0) -> Enforcement:
    """Detect, build and set up the backend for `mode` (auto | v1 | v2 | off)."""
    fallback = "; falling back to the RSS monitor (memory only, no CPU caps)"
    layout = detect_from_file(mounts_file, mode)
    if layout.version is CgroupVersion.NONE:
        return Enforcement(None, f"cgroups unavailable: {layout.reason}{fallback}")
    node_dir = sanitise(node_id)
    backend: CgroupBackend
    if layout.version is CgroupVersion.V2:
        assert layout.v2_mount is not None
        backend = CgroupV2(layout.v2_mount, cgroup_name, node_dir, cpu_period_us, hard_cpu, cores_per_vcore)
    else:
        backend = CgroupV1(layout.v1_mounts["cpu"], layout.v1_mounts["memory"], cgroup_name, node_dir,
                           cpu_period_us, hard_cpu, cores_per_vcore)
    try:
        backend.setup()
    except (CgroupError, OSError) as e:
        return Enforcement(None, f"cgroups {layout.version.value} not usable: {e}{fallback}")
    return Enforcement(backend, favor_dynmods=layout.favor_dynmods)
