"""psruntime.blas_threads holds the BLAS thread pools numpy and scipy loaded to the threads asked,
and sets the variables that libraries loaded later read (checked in a fresh interpreter, so this
test's process keeps its own pools)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import ctypes, json, os, sys
import numpy, scipy.linalg    # both OpenBLAS builds loaded
from psruntime.blas_threads import limit_blas_threads, loaded_blas_libraries

def counts():
    out = {}
    for path in loaded_blas_libraries():
        lib = ctypes.CDLL(path)
        for name in ("openblas_get_num_threads", "openblas_get_num_threads64_",
                     "scipy_openblas_get_num_threads", "scipy_openblas_get_num_threads64_"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                out[os.path.basename(path)] = fn()
                break
    return out

before = counts()
told = limit_blas_threads(1)
print(json.dumps({"before": before, "after": counts(), "told": told,
                  "env": os.environ.get("OPENBLAS_NUM_THREADS")}))
"""


def test_loaded_blas_pools_are_held_to_one_thread() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["told"] >= 1 and got["after"], got
    assert set(got["after"].values()) == {1}, got
    assert got["env"] == "1"
    if (os.cpu_count() or 1) > 1:
        assert max(got["before"].values()) > 1, got      # they started with a thread per core
