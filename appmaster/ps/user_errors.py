"""How a user app's failure ends a PS job: FAILED, with the user's traceback, at once.

A "module:Class" app's code runs in the AM (import, constructor, objective combination, held-out
evaluation) and in every executor (compute, objective, init_block ...). Its exception is not an
executor loss: the executor answers it as a `UserCodeError` (psruntime.app_role) and stays alive,
so nothing is replaced and no checkpoint is gone back to -- the same code would fail the same way.
The AM unregisters FAILED with the traceback in the diagnostics, and since it unregistered the RM
starts no other attempt. An AM whose app cannot even be built (a bad module, a constructor that
raises) registers only to unregister FAILED (`fail_before_start`).
"""
from __future__ import annotations

import logging
import traceback
from typing import Optional

from protocol.ps_job_spec import PSJobSpec
from protocol.records import FinalStatus
from psruntime.apps.base import AppConfigError
from psruntime.apps.registry import UserCodeError, is_user_app
from psruntime.apps.registry import raised_in_user_code as raised_in_user_code   # moved there (executors use it too)

from ..am_client import ApplicationMaster
from .runtime.executor_rpc import ExecutorCallError

log = logging.getLogger(__name__)


def user_error(err: BaseException) -> Optional[str]:
    """The user-code failure (message and traceback) an executor answered with, else None."""
    if isinstance(err, ExecutorCallError) and err.user_error is not None:
        return f"{err.op} on {err.executor.executor_id} ({err.executor.role.value}): {err.user_error}"
    return None


def user_failure(spec: PSJobSpec, err: BaseException) -> Optional[str]:
    """The job's diagnostics for `err` if it is a user app's failure, else None: an executor's
    answered UserCodeError, or any error of a user app's job raised in the AM, with its traceback
    (for a built-in app an AM-side exception is the runtime's, described as before)."""
    remote = user_error(err)
    if remote is not None:
        return f"user code failed: {remote}"
    if isinstance(err, UserCodeError):
        return f"user code failed: {err}"
    if is_user_app(spec.app) and not isinstance(err, ExecutorCallError) and raised_in_user_code(spec.app, err):
        tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        return f"user code failed in the AM (app {spec.app}): {type(err).__name__}: {err}\n{tb}"
    return None


def describe_start_failure(spec: PSJobSpec, err: Exception) -> str:
    """Diagnostics for an app the AM could not build (a bad config, or user code raising)."""
    if isinstance(err, UserCodeError):
        return f"user code failed: {err}"
    if isinstance(err, AppConfigError):
        return f"invalid job for app {spec.app}: {err}"
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return f"the AM could not set up app {spec.app}: {type(err).__name__}: {err}\n{tb}"


async def fail_before_start(am: ApplicationMaster, spec: PSJobSpec, err: Exception, host: str) -> str:
    """Register and at once unregister FAILED naming `err`: an AM that exits without unregistering
    would get another attempt, which would fail the same way. Returns the diagnostics."""
    diagnostics = describe_start_failure(spec, err)
    log.error("PS job cannot start: %s", diagnostics)
    await am.register(host, -1, "", start_heartbeats=False)
    await am.finish(FinalStatus.FAILED, diagnostics)
    return diagnostics
