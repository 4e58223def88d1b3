"""The asyncio driver of an RM's HA role (rm/ha/role.py): campaigns for the leader key in etcd,
renews its lease, checks its fencing token, and steps the RM down when any of that fails.

A term, from etcd's side:
- campaign: grant a lease of `lease_s`, then one transaction: if the leader key does not exist and
  the epoch key is as read, create the leader key (value: this RM's id) on the lease and store
  epoch + 1. The leader key's create revision is the term's fencing token; the epoch goes into
  the container ids the term hands out (container_e<epoch>_...).
- the cluster secret: every RM of a cluster must sign and check tokens with the same one, or a
  failover rejects every NM's and AM's token. The first campaign that finds no fingerprint of it
  in etcd stores its own (`secret_fingerprint`, in the campaign's transaction); an RM whose
  fingerprint differs from the stored one never campaigns and never rewrites it, and says why in
  its reason (SECRET_MISMATCH; docs/operating.md, "Settings"). The transaction compares the
  fingerprint key's mod revision with the one read and checked, so a fingerprint written between
  the read and the transaction makes the campaign fail, not win.
- while holding it: `lease_s / 3` after the last acknowledged renewal was sent, renew the lease
  and check, in one transaction, that the leader key still carries the token; the state store's
  writes carry the same check (rm/ha/etcd_store.py). A renewal gets `lease_s / 6` in all (both
  calls, whichever members answer; at least 0.5 s), never past the lease's deadline; one that fails
  is tried again `lease_s / 12` later, so two lost renewals in a row still leave a third its whole
  wait before the deadline: 1/3 + 2 x (1/6 + 1/12) = 5/6 of the lease (for a lease of 3 s or more
  when the two timed out; docs/operating.md, "The lease").
- stepping down: FENCED the moment a renewal or a write finds the token gone; LEASE_EXPIRED when
  etcd says the lease is gone, or when no renewal was acknowledged for a whole lease -- measured
  from the send time of the last acknowledged one, so this RM gives up no later than etcd can
  expire the lease and let another RM in.
- a standby polls the leader key (and the secret's fingerprint) every `poll_s` and campaigns when
  it is free; not for the role's hold-off after an operator's switch or a failed recovery.
- the active compacts etcd's history every `compaction_interval_s`, keeping the last interval's
  (rm/ha/compaction.py); a compaction that fails is logged and tried again at the next one.

Callbacks: `on_active(epoch, token)` (build the active RM: recover from the store and serve; the
elector fires RECOVERED when it returns, RECOVERY_FAILED when it raises) and `on_standby(reason)`
(tear it down). They run as tasks, one after another, so a slow recovery does not hold up the
lease's renewals.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from typing import Any, Awaitable, Callable, Optional

from protocol.ha_config import HAConfig

from .compaction import CompactionSchedule
from .etcd_kv import AsyncEtcd, EtcdKeys, EtcdUnavailable
from .role import HAEvent, HaRole, HAState, RoleChange

log = logging.getLogger(__name__)

TRANSITION_STOP_TIMEOUT_S = 30.0     # how long a stop waits for a role change under way to end
_FINGERPRINT_LABEL = b"elastane rm ha: cluster secret fingerprint"


def secret_fingerprint(secret: str) -> bytes:
    """What etcd holds of the cluster secret (hex): an HMAC of a fixed label keyed by it. Neither
    the secret nor a plain hash of it, as etcd's client port has no auth (docs/operating.md, "etcd")."""
    return hmac.new(secret.encode(), _FINGERPRINT_LABEL, hashlib.sha256).hexdigest().encode()


def secret_mismatch_reason(key: bytes) -> str:
    return (f"not campaigning: the cluster secret differs from the active term's (its fingerprint in etcd, "
            f"{key.decode()}): check `secret` under [cluster] in cluster.toml on every RM host")


class Elector:
    """One RM's participation in the election; `role` is its state (read it, never write it)."""

    def __init__(self, ha: HAConfig, rm_id: str,
                 on_active: Callable[[int, int], Awaitable[None]],
                 on_standby: Callable[[str], Awaitable[None]],
                 clock: Callable[[], float] = time.monotonic, cluster_secret: str = ""):
        self.ha = ha
        self.rm_id = rm_id
        self.clock = clock
        self.secret_fingerprint = secret_fingerprint(cluster_secret)
        self.secret_mismatch = False    # the stored fingerprint differs from this RM's, as last read
        self.role = HaRole(rm_id, ha.lease_s, clock())
        self.keys = EtcdKeys(ha.etcd_prefix)
        self.lease_ttl = int(ha.lease_s)
        self.renew_s = ha.lease_s / 3       # after an acknowledged renewal's send time
        # One renewal's whole wait (module doc). Not under 0.5 s: on a loaded host etcd's answers
        # can take a few hundred ms, and a 2 s lease's third of a second failed renewals etcd
        # would have answered (such a lease then survives two fast failures, not two timeouts).
        self.attempt_s = max(0.5, ha.lease_s / 6)
        self.retry_s = ha.lease_s / 12      # after a renewal that failed
        self.poll_s = min(0.5, ha.lease_s / 5)
        # A member's wait is a renewal's: a third of the lease (as before) let one timed-out renewal
        # and its retry use the whole lease up, and the RM stepped down (module doc).
        self.etcd = AsyncEtcd(ha.etcd_targets(), timeout_s=self.attempt_s)
        self._on_active = on_active
        self._on_standby = on_standby
        self.active_id = ""            # who holds the leader key, as last seen ("" = nobody)
        self.lease_id = 0
        self.etcd_error = ""           # the last etcd failure, "" once etcd answers again
        self.compaction = CompactionSchedule(ha.compaction_interval_s)
        self._wake = asyncio.Event()
        self._transitions: asyncio.Queue[Optional[Callable[[], Awaitable[None]]]] = asyncio.Queue()  # None: stop
        self._tasks: list[asyncio.Task[None]] = []
        self._retry_at: Optional[float] = None    # when the renewal that failed is tried again

    # ----- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._log(self.role.start(self.clock()))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run()), loop.create_task(self._run_transitions())]

    async def stop(self, reason: str = "the ResourceManager is stopping") -> None:
        """Leave the election: give the leader key up at once (so a standby need not wait for the
        lease), tear the active RM down, close the etcd clients."""
        held = self.role.state.holds_leadership
        if self.role.state != HAState.STOPPED:
            self._log(self.role.fire(HAEvent.STOP, self.clock(), reason))
        if self._tasks:
            # The campaign loop stops now; a role change under way runs to its end (cancelled
            # half-way, a becoming-active left its server half-started and a stepping-down its
            # server half-stopped, their ports bound), and those queued after it see the stop.
            run, transitions = self._tasks
            run.cancel()
            self._transitions.put_nowait(None)
            _, pending = await asyncio.wait({transitions}, timeout=TRANSITION_STOP_TIMEOUT_S)
            for t in pending:       # one that hangs (a recovery stuck on etcd) does not hold the stop
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if held:
            await self._revoke()
            await self._on_standby(reason)
        await self.etcd.close()

    # ----- what the RM calls ------------------------------------------------------------------
    def fenced(self, reason: str) -> None:
        """A state-store write found the token gone: step down at once (called on the loop, from
        the store's synchronous write)."""
        if self.role.state.holds_leadership:
            self._step_down(HAEvent.FENCED, reason)

    def may_act(self) -> bool:
        """Whether this RM may act as active now: it holds leadership and its lease has not run out
        by its own clock. Checked before every request and store flush of the active RM, so one
        that was paused past its lease (another RM may be active by now) steps down on the spot
        instead of serving what was queued meanwhile."""
        if not self.role.state.holds_leadership:
            return False
        if self.role.lease_expired(self.clock()):
            why = self.etcd_error or "this process was paused or blocked"
            self._step_down(HAEvent.LEASE_EXPIRED, f"no lease renewal acknowledged for {self.ha.lease_s:g}s "
                                                   f"(the lease); {why}")
            return False
        return True

    def fenced_for(self, token: int) -> Callable[[str], None]:
        """`fenced`, for the term of `token` only: a server left from an earlier term (its
        teardown waits for requests in flight) whose write the store refused must not step the
        RM's newer term down -- its refusal says that term is over, which it is."""
        def fenced(reason: str) -> None:
            if self.role.token == token:
                self.fenced(reason)
        return fenced

    def may_act_for(self, token: int) -> Callable[[], bool]:
        """`may_act`, for the term of `token` only: an earlier term's leftover server neither
        serves nor flushes (its queued AM launches stay unsent) while a newer term is active."""
        return lambda: self.role.token == token and self.may_act()

    async def transition_to_standby(self, reason: str) -> RoleChange:
        """An operator's switch (YARN's rmadmin -transitionToStandby): give the leader key up now
        and keep out of elections for the role's hold-off, so another RM takes over."""
        held = self.role.state.holds_leadership
        lease_id = self.lease_id
        change = self._step_down(HAEvent.TRANSITION_TO_STANDBY, reason)
        if held:
            await self._revoke(lease_id)
        return change

    # ----- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        while self.role.state != HAState.STOPPED:
            try:
                await self._step()
            except EtcdUnavailable as e:
                self._etcd_failed(e)
            except Exception:
                log.exception("HA elector step failed")
            await self._wait(self._interval())

    async def _step(self) -> None:
        state = self.role.state
        if state == HAState.STANDBY:
            if self.role.may_campaign(self.clock()):
                await self._campaign()
            else:
                await self._observe()
        elif state.holds_leadership:
            # Past the deadline before even asking (etcd did not answer the last renewals, or the
            # process was paused): another RM may be active already, so stop acting first.
            if self.may_act():
                await self._renew()

    def _interval(self) -> float:
        """How long until the next step: a standby's poll; the next renewal (module doc), or the
        lease's deadline if that comes first (the step then steps down)."""
        role = self.role
        deadline = role.lease_deadline()
        if deadline is None or role.renewed_at is None:
            return self.poll_s
        due = self._retry_at if self._retry_at is not None else role.renewed_at + self.renew_s
        return max(0.0, min(due, deadline) - self.clock())

    async def _wait(self, seconds: float) -> None:
        """A periodic timer that an event (a transition request) can cut short."""
        self._wake.clear()
        try:
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        except asyncio.TimeoutError:
            pass

    def _etcd_failed(self, e: Exception) -> None:
        msg = f"etcd unreachable: {e}"
        if msg != self.etcd_error:
            log.warning("%s", msg)
        self.etcd_error = msg
        if self.role.lease_expired(self.clock()):
            self._step_down(HAEvent.LEASE_EXPIRED,
                            f"no lease renewal acknowledged for {self.ha.lease_s:g}s (the lease); {msg}")

    async def _observe(self) -> None:
        await self._poll()

    async def _poll(self) -> tuple[Any, Any]:
        """A standby's look at etcd: the leader key and the secret's fingerprint (each None when
        absent). A mismatch shows in the reason while another RM is active, before any failover."""
        kv = await self.etcd.call(lambda c: c.get(self.keys.leader))
        self.active_id = kv.value.decode() if kv is not None else ""
        self.etcd_error = ""
        fp = await self.etcd.call(lambda c: c.get(self.keys.secret_fingerprint))
        self._check_secret(fp)
        return kv, fp

    def _check_secret(self, fp: Any) -> None:
        """Note whether the stored fingerprint (None: none yet) differs from this RM's; a change of
        that verdict is a role change, logged and shown as the reason."""
        mismatch = fp is not None and bytes(fp.value) != self.secret_fingerprint
        if mismatch == self.secret_mismatch:
            return
        self.secret_mismatch = mismatch
        if self.role.state != HAState.STANDBY:
            return      # stopped meanwhile
        if mismatch:
            self._log(self.role.fire(HAEvent.SECRET_MISMATCH, self.clock(),
                                     secret_mismatch_reason(self.keys.secret_fingerprint)))
        else:
            self._log(self.role.fire(HAEvent.SECRET_MATCHES, self.clock(),
                                     "the cluster secret's fingerprint in etcd matches this RM's again"))

    async def _campaign(self) -> None:
        kv, fp = await self._poll()
        if kv is not None or self.secret_mismatch:
            return
        fp_mod = fp.mod_revision if fp is not None else 0
        sent = self.clock()
        lease = await self.etcd.call(lambda c: c.lease(self.lease_ttl))
        won = False
        try:
            epoch_kv = await self.etcd.call(lambda c: c.get(self.keys.epoch))
            epoch = int(epoch_kv.value) + 1 if epoch_kv is not None else 1
            epoch_mod = epoch_kv.mod_revision if epoch_kv is not None else 0

            async def txn(c: Any) -> Any:
                t = c.transactions
                # The fingerprint as read and checked above (mod revision 0: still absent, and then
                # this term's is stored); never rewritten once there.
                record = [] if fp is not None else [t.put(self.keys.secret_fingerprint, self.secret_fingerprint)]
                return await c.transaction(
                    compare=[t.create(self.keys.leader) == 0, t.mod(self.keys.epoch) == epoch_mod,
                             t.mod(self.keys.secret_fingerprint) == fp_mod],
                    success=[t.put(self.keys.leader, self.rm_id.encode(), lease=lease.id),
                             t.put(self.keys.epoch, str(epoch).encode()), t.get(self.keys.leader), *record],
                    failure=[t.get(self.keys.leader)])

            ok, responses = await self.etcd.call(txn)
            if not ok:
                got = responses[0] if responses else []
                self.active_id = got[0][0].decode() if got else ""
                return
            token = int(responses[2][0][1].create_revision)
            won = True
        finally:
            if not won:
                await self._revoke(lease.id)
        if not self.role.may_campaign(self.clock()):
            # Stopped while campaigning, or an operator's transition-to-standby came meanwhile (its
            # hold-off says stay out): give the key back at once.
            await self._revoke(lease.id)
            return
        self.lease_id, self.active_id = lease.id, self.rm_id
        self._retry_at = None
        self.compaction.reset()
        self._log(self.role.elected(self.clock(), epoch, token, sent))
        self._transitions.put_nowait(lambda: self._become_active(epoch, token))

    async def _become_active(self, epoch: int, token: int) -> None:
        if self.role.token != token or self.role.state != HAState.BECOMING_ACTIVE:
            return      # the term ended before its turn came
        try:
            await self._on_active(epoch, token)
        except Exception as e:
            log.exception("becoming active failed")
            if self.role.token == token and self.role.state == HAState.BECOMING_ACTIVE:
                lease_id, why = self.lease_id, f"recovery failed: {e}"
                self._log(self.role.fire(HAEvent.RECOVERY_FAILED, self.clock(), why))
                self.lease_id = 0
                self._transitions.put_nowait(lambda: self._on_standby(why))
                await self._revoke(lease_id)
            return
        if self.role.token == token and self.role.state == HAState.BECOMING_ACTIVE:
            self._log(self.role.fire(HAEvent.RECOVERED, self.clock(), f"active (epoch {epoch})"))

    async def _renew(self) -> None:
        sent = self.clock()
        token = self.role.token
        deadline = self.role.lease_deadline()
        # Never waited for past the deadline: an answer after it would come too late anyway.
        budget = self.attempt_s if deadline is None else min(self.attempt_s, deadline - sent)

        async def check(c: Any) -> Any:     # the state store's guard (etcd_kv.token_compare), alone
            t = c.transactions
            return await c.transaction(compare=[t.create(self.keys.leader) == token], success=[], failure=[])

        try:
            async with asyncio.timeout(budget):
                reply = await self.etcd.call(lambda c: c.refresh_lease(self.lease_id))
                ok, _ = await self.etcd.call(check)
        except TimeoutError:
            self._retry_at = self.clock() + self.retry_s
            raise EtcdUnavailable(f"no answer to a lease renewal within {budget:.2f}s") from None
        except Exception:
            self._retry_at = self.clock() + self.retry_s
            raise
        self._retry_at = None
        self.etcd_error = ""
        if self.role.token != token:
            return      # the term ended while the calls were out
        if reply is None or int(reply.TTL) <= 0:
            self._step_down(HAEvent.LEASE_EXPIRED, "etcd says this RM's lease has expired")
        elif not ok:
            self._step_down(HAEvent.FENCED, "the leader key no longer carries this RM's token: "
                                            "another ResourceManager is active, or the key was deleted")
        else:
            self.role.renewed(sent)
            if self.role.state == HAState.ACTIVE:
                await self._compact(int(reply.header.revision))

    async def _compact(self, revision: int) -> None:
        """Compact etcd's history if the schedule says it is due (module doc)."""
        due = self.compaction.observe(self.clock(), revision)
        if due is None:
            return
        try:
            await self.etcd.call(lambda c: c.compact(due))
        except Exception as e:  # noqa: BLE001 - housekeeping: never a reason to step down
            log.warning("compacting etcd's history to revision %d failed (tried again in %.0f s): %s",
                        due, self.compaction.interval_s, e)
            return
        log.info("compacted etcd's history to revision %d (etcd at %d)", due, revision)

    # ----- stepping down ----------------------------------------------------------------------
    def _step_down(self, event: HAEvent, reason: str) -> RoleChange:
        held = self.role.state.holds_leadership
        change = self.role.fire(event, self.clock(), reason)
        self._log(change)
        if held:
            self.active_id = ""
            self.lease_id = 0
            self._transitions.put_nowait(lambda: self._on_standby(reason))
        self._wake.set()
        return change

    async def _revoke(self, lease_id: Optional[int] = None) -> None:
        lid = self.lease_id if lease_id is None else lease_id
        if not lid:
            return
        try:
            await self.etcd.call(lambda c: c.revoke_lease(lid))
        except Exception as e:  # noqa: BLE001 - best effort: the lease runs out by itself anyway
            log.info("could not revoke lease %x: %s", lid, e)

    async def _run_transitions(self) -> None:
        while True:
            job = await self._transitions.get()
            if job is None:
                return
            try:
                await job()
            except Exception:
                log.exception("HA transition failed")

    def _log(self, change: RoleChange) -> None:
        log.warning("RM %s: %s -> %s (%s): %s", self.rm_id, change.old.value, change.new.value,
                    change.event.value, change.reason)
