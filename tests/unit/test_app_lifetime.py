"""Application lifetime (YARN's LIFETIME timeout): an app not finished by its expiry is killed by
the RM; queues give a default and a cap; the owner or an admin moves the expiry. The pure rules,
then the REST API on an in-process RM with a fake clock, then the CLI's part."""
from __future__ import annotations

import pytest

from cli_runner import run_cli
from elastane_cli.app_commands import expiry_in, lifetime_text
from protocol import config as config_mod
from protocol.app_timeouts import LifetimeError, format_expiry, lifetime_timeouts, parse_expiry
from protocol.config import QueueConfig
from rm.__main__ import load_configs, parse_args
from rm.app_lifetime import TIMED_OUT_DIAGNOSTICS, LifetimeMonitor, check_new_expiry, effective_lifetime, remaining_s
from test_rm_api import BASE, Env, close_env, make_env, submission

T0 = 1_790_000_000.0


@pytest.mark.parametrize("requested, default, cap, expected", [
    (None, -1, -1, None),        # nothing asked, nothing configured: unlimited
    (60, -1, -1, 60),
    (None, 300, -1, 300),        # the queue's default fills in
    (60, 300, -1, 60),           # ... but never overrides what was asked
    (None, -1, 900, 900),        # a capped queue gives an unlimited app the cap
    (3600, 300, 900, 900),       # and caps one that asks for more
    (600, 300, 900, 600),
    (0, 300, 0, 300),            # 0 counts as not given / not configured
])
def test_the_lifetime_an_app_gets_from_its_queue(requested, default, cap, expected) -> None:
    assert effective_lifetime(requested, default, cap) == expected


def test_expiry_times_are_yarns_iso_8601_with_a_zone() -> None:
    text = format_expiry(T0 + 0.25)
    assert text == "2026-09-21T14:13:20.250+0000"
    assert parse_expiry(text) == T0 + 0.25
    assert parse_expiry("2026-09-21T19:43:20.250+05:30") == T0 + 0.25
    assert parse_expiry("2026-09-21T14:13:20Z") == T0
    assert format_expiry(None) == "UNLIMITED"
    with pytest.raises(LifetimeError, match="no time zone"):
        parse_expiry("2026-09-21T12:53:20")
    with pytest.raises(LifetimeError, match="not an ISO 8601 time"):
        parse_expiry("tomorrow")
    assert format_expiry(parse_expiry("9999-12-31T23:59:59+0000")) == "9999-12-31T23:59:59.000+0000"
    with pytest.raises(LifetimeError, match="after 9999-12-31T23:59:59.000"):
        parse_expiry("9999-12-31T23:00:00.000-1200")       # the year 10000 in UTC
    # The year 0 in UTC: no expiryTime can show it, not even the error's (it was a 500).
    with pytest.raises(LifetimeError, match="before 0001-01-01T00:00:00.000[+]0000, the earliest"):
        parse_expiry("0001-01-01T00:00:00+14:00")
    assert format_expiry(parse_expiry("0999-03-04T05:06:07Z")) == "0999-03-04T05:06:07.000+0000"  # 4-digit year


def test_a_new_expiry_must_be_ahead_and_within_the_queues_cap() -> None:
    check_new_expiry(T0 + 10, T0, T0 - 100, -1)
    with pytest.raises(LifetimeError, match="not after the current time"):
        check_new_expiry(T0, T0, T0 - 100, -1)
    with pytest.raises(LifetimeError, match="maximum lifetime of 900 s"):
        check_new_expiry(T0 + 801, T0, T0 - 100, 900)
    check_new_expiry(T0 + 800, T0, T0 - 100, 900)
    assert (remaining_s(None, T0, False), remaining_s(T0 + 9.5, T0, False), remaining_s(T0 + 9, T0, True),
            remaining_s(T0 - 5, T0, False)) == (-1, 9, 0, 0)


def test_the_monitor_hands_out_each_due_app_once_at_its_latest_expiry() -> None:
    m = LifetimeMonitor()
    m.set("a", T0 + 10)
    m.set("b", T0 + 5)
    m.set("c", T0 + 7)
    m.set("a", T0 + 20)          # moved later: its first entry is stale
    m.forget("c")                # finished
    assert m.due(T0 + 4) == []
    assert m.due(T0 + 10) == ["b"]
    assert m.due(T0 + 19) == []
    assert m.due(T0 + 20) == ["a"] and len(m) == 0
    m.set("d", T0 + 30)
    m.set("d", None)             # no lifetime any more
    assert m.due(T0 + 100) == []
    for i in range(500):         # stale entries do not pile up
        m.set("e", T0 + 1000 + i)
    assert m.due(T0 + 999) == [] and len(m._heap) < 200


# ----- the REST API ---------------------------------------------------------------------------------

QUEUES = [QueueConfig("default", 70, 100), QueueConfig("capped", 30, 50, default_app_lifetime_s=300,
                                                       max_app_lifetime_s=900)]


async def _timeout(env: Env, app_id: str) -> dict:
    return (await env.call("GET", f"{BASE}/apps/{app_id}/timeouts/LIFETIME"))["timeout"]


async def test_an_app_past_its_lifetime_is_killed_and_says_why(tmp_path) -> None:
    env = await make_env(tmp_path, queues=QUEUES)
    try:
        await env.register_node("n1:1")
        timed = await env.submit(**{"application-timeouts": lifetime_timeouts(60)})
        free = await env.submit()
        t = await _timeout(env, timed)
        assert t == {"type": "LIFETIME", "expiryTime": format_expiry(env.rm.core.apps[timed].submit_time + 60),
                     "remainingTimeInSeconds": 60}
        assert (await _timeout(env, free))["expiryTime"] == "UNLIMITED"
        assert (await env.app(timed))["timeouts"]["timeout"] == [t]
        env.clock.advance(59.5)
        env.rm.core.tick()
        assert (await env.app(timed))["state"] == "ACCEPTED"
        env.clock.advance(0.5)
        env.rm.core.tick()
        a = await env.app(timed)
        assert (a["state"], a["finalStatus"], a["diagnostics"]) == ("KILLED", "KILLED", TIMED_OUT_DIAGNOSTICS)
        assert (await _timeout(env, timed))["remainingTimeInSeconds"] == 0
        assert (await env.app(free))["state"] == "ACCEPTED"        # no lifetime: left alone
        env.clock.advance(10 ** 6)
        env.rm.core.tick()
        assert (await env.app(free))["state"] == "ACCEPTED"
    finally:
        await close_env(env)


async def test_a_queues_default_and_cap_apply_and_an_update_moves_the_expiry(tmp_path) -> None:
    env = await make_env(tmp_path, queues=QUEUES)
    try:
        dflt = await env.submit(queue="capped")
        long = await env.submit(queue="capped", **{"application-timeouts": lifetime_timeouts(3600)})
        assert (await _timeout(env, dflt))["remainingTimeInSeconds"] == 300
        assert (await _timeout(env, long))["remainingTimeInSeconds"] == 900
        submitted = env.rm.core.apps[dflt].submit_time
        env.clock.advance(100)
        new_expiry = format_expiry(submitted + 800)          # to the millisecond, as on the wire
        moved = await env.call("PUT", f"{BASE}/apps/{dflt}/timeout",
                               {"timeout": {"type": "LIFETIME", "expiryTime": new_expiry}}, **{"user.name": "alice"})
        assert moved["timeout"] == {"type": "LIFETIME", "expiryTime": new_expiry,
                                    "remainingTimeInSeconds": int(parse_expiry(new_expiry) - env.clock())}
        env.clock.advance(200)               # past the submitted lifetime (300 s), before the new expiry
        env.rm.core.tick()
        assert (await env.app(dflt))["state"] == "ACCEPTED"
        env.clock.advance(500)
        env.rm.core.tick()
        assert (await env.app(dflt))["diagnostics"] == TIMED_OUT_DIAGNOSTICS
        assert (await env.app(long))["state"] == "ACCEPTED"       # its cap is at 900 s
        env.clock.advance(100)
        env.rm.core.tick()
        assert (await env.app(long))["state"] == "KILLED"
    finally:
        await close_env(env)


async def test_bad_lifetimes_and_updates_are_refused_and_change_nothing(tmp_path) -> None:
    env = await make_env(tmp_path, queues=QUEUES)
    try:
        for timeouts, needle in [({"timeout": [{"type": "DEADLINE", "value": 5}]}, "only LIFETIME"),
                                 ({"timeout": {"type": "LIFETIME", "value": 0}}, "must be > 0 seconds"),
                                 ({"timeout": [{"type": "LIFETIME", "value": 5}, {"type": "LIFETIME", "value": 6}]},
                                  "given twice"),
                                 ({"timeout": [{"type": "LIFETIME", "value": "soon"}]}, "value"),
                                 # an expiry in the year 33715 could be stored but never shown
                                 ({"timeout": {"type": "LIFETIME", "value": 10**12}}, "at most 3153600000 seconds")]:
            new = await env.call("POST", BASE + "/apps/new-application")
            err = await env.call("POST", BASE + "/apps", submission(new["application-id"],
                                                                    **{"application-timeouts": timeouts}), status=400)
            assert needle in err["RemoteException"]["message"]
            assert new["application-id"] not in env.rm.core.apps
        app_id = await env.submit(queue="capped")
        before = env.rm.core.apps[app_id].lifetime_expiry
        now = env.clock()
        path = f"{BASE}/apps/{app_id}/timeout"
        for body, status, needle, user in [
                ({"timeout": {"type": "LIFETIME", "expiryTime": format_expiry(now - 1)}}, 400, "not after", "alice"),
                ({"timeout": {"type": "LIFETIME", "expiryTime": format_expiry(now + 901)}}, 400,
                 "maximum lifetime of 900 s", "alice"),
                ({"timeout": {"type": "LIFETIME", "expiryTime": "next week"}}, 400, "ISO 8601", "alice"),
                # the year 10000 in UTC: past the latest expiryTime any reply or page can write
                ({"timeout": {"type": "LIFETIME", "expiryTime": "9999-12-31T23:00:00.000-1200"}}, 400,
                 "the latest time the API can show", "alice"),
                # the year 0 in UTC: before the earliest (a 500 once, from formatting the error)
                ({"timeout": {"type": "LIFETIME", "expiryTime": "0001-01-01T00:00:00+14:00"}}, 400,
                 "timeout.expiryTime is before 0001-01-01T00:00:00.000+0000", "alice"),
                ({"timeout": {"type": "QUEUE", "expiryTime": format_expiry(now + 60)}}, 400, "only LIFETIME", "alice"),
                ({"timeout": {"type": "LIFETIME"}}, 400, "expiryTime", "alice"),
                ({"timeout": {"type": "LIFETIME", "expiryTime": format_expiry(now + 60)}}, 403, "not allowed", "bob")]:
            err = await env.call("PUT", path, body, status=status, **{"user.name": user})
            assert needle in err["RemoteException"]["message"], err
            assert env.rm.core.apps[app_id].lifetime_expiry == before
        assert (await _timeout(env, app_id))["expiryTime"] == format_expiry(before)     # still shown
        await env.call("GET", f"{BASE}/apps/{app_id}/timeouts/QUEUE", status=400)
        # an admin may; a finished app may not be updated any more
        await env.call("PUT", path, {"timeout": {"type": "LIFETIME", "expiryTime": format_expiry(now + 60)}},
                       **{"user.name": "root"})
        await env.call("PUT", f"{BASE}/apps/{app_id}/state", {"state": "KILLED"}, status=202, **{"user.name": "alice"})
        err = await env.call("PUT", path, {"timeout": {"type": "LIFETIME", "expiryTime": format_expiry(now + 90)}},
                             status=400, **{"user.name": "alice"})
        assert "finished application" in err["RemoteException"]["message"]
    finally:
        await close_env(env)


async def test_a_lifetime_survives_an_rm_restart_and_one_that_ran_out_meanwhile_ends_at_the_first_tick(tmp_path):
    env = await make_env(tmp_path)
    timed = await env.submit(**{"application-timeouts": lifetime_timeouts(60)})
    moved = await env.submit(**{"application-timeouts": lifetime_timeouts(60)})
    expiry = parse_expiry(format_expiry(env.rm.core.apps[moved].submit_time + 500))
    await env.call("PUT", f"{BASE}/apps/{moved}/timeout",
                   {"timeout": {"type": "LIFETIME", "expiryTime": format_expiry(expiry)}}, **{"user.name": "alice"})
    await close_env(env)
    env.clock.advance(120)                   # down past the first one's expiry
    env2 = await make_env(tmp_path, clock=env.clock)
    try:
        assert env2.rm.core.apps[moved].lifetime_expiry == expiry
        env2.rm.core.tick()
        assert (await env2.app(timed))["diagnostics"] == TIMED_OUT_DIAGNOSTICS
        assert (await env2.app(moved))["state"] != "KILLED"
        assert (await _timeout(env2, moved))["remainingTimeInSeconds"] == int(expiry - env2.clock())
    finally:
        await close_env(env2)


# ----- the CLI's part ---------------------------------------------------------------------------------

def test_the_cli_sends_an_expiry_the_rm_reads_and_shows_whats_left() -> None:
    assert parse_expiry(expiry_in(90, now=T0)) == T0 + 90
    view = {"timeouts": {"timeout": [{"type": "LIFETIME", "expiryTime": format_expiry(T0),
                                      "remainingTimeInSeconds": 125}]}}
    assert lifetime_text(view) == f"expires {format_expiry(T0)} (2m05s left)"
    assert lifetime_text({"timeouts": {"timeout": [{"type": "LIFETIME", "expiryTime": "UNLIMITED",
                                                    "remainingTimeInSeconds": -1}]}}) == "UNLIMITED"
    assert lifetime_text({}) == "-"                # an RM that does not say


@pytest.mark.parametrize("argv", [["app", "update-lifetime", "application_1_0001", "1000000000000"],
                                  ["app", "run", "--lifetime", "3153600001", "--", "true"],
                                  ["ps", "submit", "--app", "mlr", "--lifetime", "99999999999"]])
def test_the_cli_refuses_a_lifetime_past_100_years_before_sending_it(argv, capsys) -> None:
    # Nothing listens at that address: a request would exit 1, so exit 2 shows nothing was sent.
    code, _, err = run_cli(["--rm", "http://127.0.0.1:9", *argv], capsys)
    assert code == 2
    assert "the lifetime must be at most 3153600000 seconds" in err


def test_a_queue_whose_default_lifetime_exceeds_its_maximum_stops_the_rm(tmp_path) -> None:
    (tmp_path / "rm.toml").write_text('[[queues]]\nname = "q"\ndefault_app_lifetime_s = 600\nmax_app_lifetime_s = 60\n')
    (tmp_path / "cluster.toml").write_text('[cluster]\nsecret = "s"\n')
    argv = ["--config", str(tmp_path / "rm.toml"), "--cluster-config", str(tmp_path / "cluster.toml")]
    with pytest.raises(config_mod.ConfigError, match="queue 'q': default_app_lifetime_s 600 exceeds max_app_lifetime_s 60"):
        load_configs(parse_args(argv))
    (tmp_path / "rm.toml").write_text('[[queues]]\nname = "q"\nmax_app_lifetime_s = 99999999999\n')
    with pytest.raises(config_mod.ConfigError, match="queue 'q': max_app_lifetime_s must be at most 3153600000"):
        load_configs(parse_args(argv))
    (tmp_path / "rm.toml").write_text('[[queues]]\nname = "q"\ndefault_app_lifetime_s = 600\n')
    rm_cfg = load_configs(parse_args(argv))[0]
    assert rm_cfg.queues[0].default_app_lifetime_s == 600 and rm_cfg.queues[0].max_app_lifetime_s == -1
