"""An executor answers a user app's op failure as UserCodeError (the AM fails the job at once,
blaming the user's code) only when the user's code raised it: the exception's traceback passes
through the app's package (compute, keys_for_batch, init_block ... called by the runtime, on the
loop or in the compute thread), or it is the runtime's check of what that code returned. The
runtime's own failures in a user app's op -- a full spill disk, an arbiter's refusal, a stale
ownership table -- are answered as what they are."""
from __future__ import annotations

import asyncio
import errno
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any, AsyncIterator, Callable, Iterator

import pytest

from psruntime.app_role import AppRole
from psruntime.apps.base import AppOutputError
from psruntime.apps.registry import UserCodeError
from psruntime.arbiter_client import ArbiterRefused
from psruntime.spill.spill_store import SpillError
from psruntime.store.ownership_table import OwnershipError
from psruntime.executor import Executor
from psruntime.store.migration_controller import MigrationController
from psruntime.store.ownership_table import OwnershipTable
from psruntime.wire.dataplane import DataPlaneClient, RemoteError, RequestError
from user_app_source import linreg_source

APP = "errs_pkg.model:MyApp"


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    pkg = tmp_path / "errs_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text("def compute(batch):\n    return batch['missing']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import errs_pkg.model as model
    yield model
    for name in [m for m in sys.modules if m == "errs_pkg" or m.startswith("errs_pkg.")]:
        del sys.modules[name]


def role_with_user_app() -> AppRole:
    role = AppRole(SimpleNamespace(executor_id="e7"))  # type: ignore[arg-type]
    role.app, role.app_name = object(), APP   # type: ignore[assignment]
    return role


def answered(role: AppRole, fail: Callable[[], Any]) -> BaseException:
    """What the op wrapper raises for an op that calls `fail` on the loop."""
    def op(request: Any, arrays: Any) -> Any:
        return fail()
    with pytest.raises(Exception) as info:
        role._reporting_user_errors(op)(None, ())  # type: ignore[arg-type]
    return info.value


async def answered_async(role: AppRole, fail: Callable[[], Any]) -> BaseException:
    """... and for an async op that runs `fail` in a thread (as the pipeline runs a COMP)."""
    async def op(request: Any, arrays: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fail)
    with pytest.raises(Exception) as info:
        await role._reporting_user_errors(op)(None, ())  # type: ignore[arg-type, misc]
    return info.value


def raiser(e: BaseException) -> Callable[[], None]:
    def runtime_code() -> None:
        raise e
    return runtime_code


RUNTIME_FAILURES = {
    "SpillError": lambda: SpillError("spill dir full: [Errno 28] No space left on device"),
    "ENOSPC": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "ArbiterRefused": lambda: ArbiterRefused("arbiter refused request 7 (op 1)"),
    "OwnershipError": lambda: OwnershipError("table older than the executor's"),
    "RuntimeError": lambda: RuntimeError("a runtime bug"),
}


@pytest.mark.parametrize("make", list(RUNTIME_FAILURES.values()), ids=list(RUNTIME_FAILURES))
async def test_the_runtimes_own_failures_in_a_user_apps_op_are_answered_as_they_are(make: Any) -> None:
    role = role_with_user_app()
    for got in (answered(role, raiser(make())), await answered_async(role, raiser(make()))):
        assert not isinstance(got, UserCodeError), got
        assert type(got) is type(make())


async def test_what_the_users_code_raises_is_answered_as_user_code_error(user_module: types.ModuleType) -> None:
    role = role_with_user_app()
    for got in (answered(role, lambda: user_module.compute({})),
                await answered_async(role, lambda: user_module.compute({}))):
        assert isinstance(got, UserCodeError), got
        assert str(got).startswith(f"app {APP} on e7: KeyError: 'missing'")
        assert "errs_pkg/model.py" in str(got)       # the user's traceback goes to the AM


def test_a_user_apps_faulty_output_and_the_runtimes_deliberate_errors() -> None:
    role = role_with_user_app()
    assert isinstance(answered(role, raiser(AppOutputError("app 'mine': compute returned 3 keys"))), UserCodeError)

    def bad_config(user_module_error: Exception) -> None:
        try:
            raise user_module_error
        except ValueError as e:
            raise RequestError(f"bad config: {e}") from None
    assert type(answered(role, lambda: bad_config(ValueError("x")))) is RequestError


def test_a_builtin_apps_failures_are_never_user_code_errors(user_module: types.ModuleType) -> None:
    role = role_with_user_app()
    role.app_name = "lda"
    assert type(answered(role, lambda: user_module.compute({}))) is KeyError


@pytest.fixture
async def user_app_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                       ) -> AsyncIterator[tuple[Executor, DataPlaneClient]]:
    """A server and a worker of the user app "errs_linreg:LinRegApp" (its compute raises), set up."""
    (tmp_path / "errs_linreg.py").write_text(linreg_source(fail_in_compute=True))
    monkeypatch.chdir(tmp_path)            # the registry imports a user app from the working dir
    server, worker = Executor("server-0", 4), Executor("worker-0", 4, role="worker")
    addrs = {e.executor_id: await e.start() for e in (server, worker)}
    ctl = MigrationController(OwnershipTable.round_robin(4, ["server-0"], addrs))
    await ctl.broadcast()
    am = DataPlaneClient()
    try:
        for e in (server, worker):
            await am.request(e.address, {"op": "app_setup", "app": "errs_linreg:LinRegApp"})
        for op in ({"op": "worker_setup", "partition": 0, "num_partitions": 1}, {"op": "init_model"},
                   {"op": "init_blocks"}):
            await am.request(worker.address, op)
        yield worker, am
    finally:
        await am.close()
        await ctl.close()
        for e in (server, worker):
            await e.stop()
        sys.modules.pop("errs_linreg", None)
        sys.path[:] = [p for p in sys.path if p != str(tmp_path)]


async def test_over_the_wire_a_user_compute_is_blamed_and_a_full_disk_is_not(
        user_app_job: tuple[Executor, DataPlaneClient], monkeypatch: pytest.MonkeyPatch) -> None:
    worker, am = user_app_job
    clock = {"op": "run_clock", "epoch": 0, "batches": 1, "num_workers": 1, "clock": 0}
    with pytest.raises(RemoteError) as info:
        await am.request(worker.address, clock)
    assert info.value.kind == "UserCodeError" and "ZeroDivisionError: linreg: a bug in the user's compute" in str(
        info.value) and "errs_linreg.py" in str(info.value)

    async def disk_full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(worker.app_role.pipeline, "run_batches", disk_full)
    with pytest.raises(RemoteError) as info:
        await am.request(worker.address, clock)
    assert info.value.kind == "OSError", info.value
