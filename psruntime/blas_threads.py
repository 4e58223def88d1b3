"""The BLAS thread pools of the process, held to the cores its cgroup allows.

numpy and scipy each ship an OpenBLAS that starts a thread per core the machine has, whatever the
process may use, and whose idle threads spin before they sleep. Under a CPU quota of a fraction of
a core those spinning threads burn the budget the COMP needs: on NMF (small 5x5 solves per user)
they took a quarter of a capped worker's CPU. So an executor (and the single-process baseline)
holds its pools to the quota's cores rounded up (`limit_blas_threads_to_cgroup`), as PySpark sets
OMP_NUM_THREADS to a task's CPUs. The quota is the smallest along the process's own cgroup path
(/proc/self/cgroup) up to the root: an NM container's cgroup sits below the root
(<mount>/elastane/<node>/<container>, no cgroup namespace), so the root's cpu.max alone would say
"unlimited" to a 1-vcore executor on a 16-core host. Without a quota they are left alone: there a
second BLAS thread uses an idle core (holding them to one always made an EPS add's new worker, whose
data generation used both cores of an unquota'd 2-core machine, 70 ms slower: bench/eps_overhead.py
0.10 -> 0.17 s).

Libraries loaded later read the environment variables set here; those already loaded (the zygote
preloads numpy) are told through their `*_set_num_threads` entry points, found in the process's
memory map. Linux only; elsewhere, and for a BLAS without such an entry point, nothing changes.
"""
from __future__ import annotations

import ctypes
import math
import os

from protocol.cgroup_cpu import process_cgroup_cores

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# The setters of the OpenBLAS builds numpy and scipy wheels ship (plain, scipy_openblas and their
# ILP64 "64_" forms).
SETTERS = ("openblas_set_num_threads", "openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
           "scipy_openblas_set_num_threads64_")


def loaded_blas_libraries(maps_path: str = "/proc/self/maps") -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process."""
    try:
        with open(maps_path) as f:
            paths = {line.split()[-1] for line in f if "openblas" in line and "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if ".so" in os.path.basename(p))


def limit_blas_threads(threads: int) -> int:
    """Hold every BLAS thread pool of this process (and of libraries it loads later) to `threads`;
    returns the number of loaded libraries told."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    for var in THREAD_VARS:
        os.environ[var] = str(threads)
    told = 0
    for path in loaded_blas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter.restype = None
                setter(threads)
                told += 1
                break
    return told


def blas_threads_for_cgroup(root: str = "/sys/fs/cgroup", cpus: int | None = None,
                            proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """The BLAS threads for a process under the cgroup mount `root`: the CPU quota's cores rounded
    up, when that is below the machine's `cpus`; None (leave BLAS alone) without a quota. The quota
    is the smallest along the process's own cgroup path (read from `proc_cgroup`) up to the root
    (protocol.cgroup_cpu.process_cgroup_cores): a container's own cgroup, not the root alone."""
    cores = process_cgroup_cores(root, proc_cgroup)
    cpus = cpus or os.cpu_count() or 1
    if cores is None:
        return None
    threads = max(1, math.ceil(cores - 1e-9))
    return threads if threads < cpus else None


def limit_blas_threads_to_cgroup(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int | None:
    """`limit_blas_threads` to `blas_threads_for_cgroup`'s count, if any; returns it."""
    threads = blas_threads_for_cgroup(root, proc_cgroup=proc_cgroup)
    if threads is not None:
        limit_blas_threads(threads)
    return threads
