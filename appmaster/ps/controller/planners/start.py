"""The job's start as a planner: its first servers, then its first workers, then the set-up --
or, for a new AM attempt, the restore of the checkpoint an earlier attempt left -- then training.
A new attempt that was handed the failed attempt's running executors first tries to take them
over (AdoptExecutors: nothing to launch, set up or restore); if that fails it starts as above.

The first executors go where the policy's first directive (a policy that places new jobs:
Harmony) or else the spec's placement puts them (one strict ask per node), else anywhere. Once
training runs, a job that recovers from losses takes its first checkpoint at once: what a
recovery goes back to.
"""
from __future__ import annotations

from protocol.internal_api import counts_on_nodes

from ..events import StepDone, StepFailed
from protocol.internal_api import RunState

from ..instructions import (AdoptExecutors, Instruction, RestoreCheckpoint, SetupTraining,
                            StartExecutors, WriteCheckpoint)
from ..phases import Trigger
from ..records import Role
from ..state import Change, ChangeKind, JobState
from .base import BasePlanner, end_job_failed, fire, issue, resume_training


class StartPlanner(BasePlanner):
    """STARTING -> LAUNCHING_SERVERS -> LAUNCHING_WORKERS -> INITIALISING | RESTORING -> TRAINING,
    or STARTING -> ADOPTING -> TRAINING (falling back to LAUNCHING_SERVERS)."""

    kind = ChangeKind.START

    def begin(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        if job.adopt:
            fire(job, Trigger.ADOPT)
            change.stage = "adopt"
            issue(change, out, AdoptExecutors(step=job.new_step()))
            return
        fire(job, Trigger.REGISTERED)
        change.stage = "servers"
        self._start(job, change, Role.SERVER, out)

    def _start(self, job: JobState, change: Change, role: Role, out: list[Instruction]) -> None:
        d = job.first_directive
        if d is not None:
            count = d.servers if role is Role.SERVER else d.workers
            per_node = counts_on_nodes(d.placement, role.value)
            if d.executor_resource is not None:
                job.memory_mb, job.vcores = d.executor_resource.memory, d.executor_resource.vcores
        else:
            count = job.spec.servers if role is Role.SERVER else job.spec.workers
            per_node = counts_on_nodes(job.spec.placement, role.value)
        issue(change, out, StartExecutors(step=job.new_step(), role=role, count=count, per_node=per_node))

    def done(self, job: JobState, change: Change, ev: StepDone, out: list[Instruction]) -> None:
        if change.stage == "adopt":
            fire(job, Trigger.INITIALISED)
            if ev.epochs_done is not None:
                job.epoch = ev.epochs_done
            if ev.directory:       # the failed attempt's latest checkpoint: what a recovery goes back to
                job.checkpoints.append((ev.checkpoint_epoch, ev.directory))
            job.push_logs_incomplete_at = len(job.checkpoints)      # (state.py: a take-over's clocks)
            self._set_up(job, change, out)
        elif change.stage == "servers":
            fire(job, Trigger.SERVERS_READY)
            change.stage = "workers"
            self._start(job, change, Role.WORKER, out)
        elif change.stage == "workers":
            servers, workers = job.ids(Role.SERVER), job.ids(Role.WORKER)
            if job.resume_from:
                fire(job, Trigger.WORKERS_READY_RESUME)
                issue(change, out, RestoreCheckpoint(step=job.new_step(), directory=job.resume_from,
                                                     servers=servers, workers=workers))
            else:
                fire(job, Trigger.WORKERS_READY)
                issue(change, out, SetupTraining(step=job.new_step()))
            change.stage = "setup"
        elif change.stage == "setup":
            fire(job, Trigger.INITIALISED)
            if job.resume_from and ev.directory:
                # Resumed from an earlier attempt's checkpoint: what a recovery goes back to (an
                # "initial" one written now would take a mid-epoch model for its epoch's start).
                if ev.epochs_done is not None:
                    job.epoch = ev.epochs_done
                job.checkpoints.append((ev.checkpoint_epoch, ev.directory))
            self._set_up(job, change, out)
        elif change.stage == "checkpoint":
            job.checkpoints.append((job.epoch, ev.directory))
            self._train(job, change, out)
        elif change.stage == "train":
            change.stage = "done"

    def _set_up(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        """Set up (or taken over): a job that recovers from losses needs a checkpoint to go back
        to before it trains."""
        if job.spec.max_executor_failures > 0 and not job.checkpoints:
            change.stage = "checkpoint"      # what a recovery goes back to
            issue(change, out, WriteCheckpoint(step=job.new_step(), epoch=job.epoch, reason="initial"))
        else:
            self._train(job, change, out)

    def _train(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        change.stage = "train"
        resume_training(job, change, out)

    def failed(self, job: JobState, change: Change, ev: StepFailed, out: list[Instruction]) -> None:
        if change.stage == "adopt" and not ev.cancelled:
            # The executors could not be taken over (the interpreter stopped them): start new ones,
            # on the policy's directive if one came meanwhile (the job did not wait for it).
            job.adopt = False
            fire(job, Trigger.ADOPT_FAILED)
            kept = job.kept_directive
            if job.policy_places and kept is not None and kept.run_state is not RunState.PAUSE:
                job.first_directive, job.applied_directive, job.kept_directive = kept, kept.version, None
            change.stage = "servers"
            self._start(job, change, Role.SERVER, out)
            return
        end_job_failed(job, change, ev.error, out)
