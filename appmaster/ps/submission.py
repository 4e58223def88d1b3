"""Client side: the YARN REST submission context that runs a PS job (POST /ws/v1/cluster/apps).

The spec travels twice on purpose: in the Elastane extension `{"elastane": {"ps-job": spec}}`,
which the RM validates at submission (400 naming the field), and in the AM's env
`ELASTANE_PS_SPEC`, which the RM overwrites with the validated, normalised spec.

The spec's `resources` (a user app's modules and files) become the AM container's
`local-resources` too: the AM imports a "module:Class" app from its working dir, and passes the
same resources on to every executor container it launches.
"""
from __future__ import annotations

from typing import Any, Mapping

import msgspec

from protocol import ps_job_spec
from protocol.ps_job_spec import PSJobSpec


def build_ps_submission(spec: PSJobSpec | Mapping[str, Any], name: str = "ps-job", queue: str = "default",
                        am_memory: int = 512, am_vcores: int = 1, max_app_attempts: int = 1,
                        app_id: str | None = None, environment: Mapping[str, str] | None = None,
                        keep_containers: bool | None = None) -> dict[str, Any]:
    """The full YARN submission dict for a PS job; raises JobSpecError / ValueError naming the field.

    `app_id` comes from POST /ws/v1/cluster/apps/new-application; if None, set "application-id"
    before submitting. `keep_containers`: YARN's keep-containers-across-application-attempts (None
    leaves it to the RM: on for PS jobs, so a new AM attempt takes the executors over).
    """
    valid = ps_job_spec.validate(spec if isinstance(spec, PSJobSpec) else dict(spec))
    for label, v in (("am_memory", am_memory), ("am_vcores", am_vcores), ("max_app_attempts", max_app_attempts)):
        if v <= 0:
            raise ValueError(f"{label} must be positive, got {v}")
    spec_json = valid.to_json()
    env = {"PYTHONUNBUFFERED": "1", **(environment or {}),
           ps_job_spec.PS_SPEC_ENV: msgspec.json.encode(spec_json).decode()}
    sub: dict[str, Any] = {
        "application-name": name,
        "application-type": ps_job_spec.APPLICATION_TYPE,
        "queue": queue,
        "am-container-spec": {
            "commands": {"command": ps_job_spec.AM_COMMAND},
            "environment": {"entry": [{"key": k, "value": v} for k, v in env.items()]},
        },
        "max-app-attempts": max_app_attempts,
        "resource": {"memory": am_memory, "vCores": am_vcores},
        "elastane": {ps_job_spec.ELASTANE_FIELD: spec_json},
    }
    if keep_containers is not None:
        sub["keep-containers-across-application-attempts"] = keep_containers
    if valid.resources:
        sub["am-container-spec"]["local-resources"] = {
            "entry": [{"key": k, "value": msgspec.to_builtins(r)} for k, r in valid.resources.items()]}
    if app_id is not None:
        sub = {"application-id": app_id, **sub}
    return sub
