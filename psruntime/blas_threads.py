"""The BLAS thread pools of the process, held to the threads a COMP may use.

numpy and scipy each ship an OpenBLAS that starts a thread per core the machine has, whatever the
container was given, and whose idle threads spin before they sleep. In an executor capped at a
fraction of a core those spinning threads burn the budget the COMP needs: on bench/ps1_overhead.py's
NMF (small 5x5 solves per user) they took a quarter of the worker's CPU. A COMP's parallelism is
the app's own shards (StepContext.threads, docs/harmony_arbiter.md), so BLAS runs one thread inside
each -- as PySpark sets OMP_NUM_THREADS to a task's CPUs.

Libraries loaded later read the environment variables set here; those already loaded (the zygote
preloads numpy) are told through their `*_set_num_threads` entry points, found in the process's
memory map. Linux only; elsewhere, and for a BLAS without such an entry point, nothing changes.
"""
from __future__ import annotations

import ctypes
import os

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
