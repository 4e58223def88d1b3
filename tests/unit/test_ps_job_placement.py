"""A PS job spec's `placement` (where its first executors go): a good one round-trips and gives the
per-node counts the AM's first asks use; each bad one is refused with a message naming the entry
and what is wrong, by the spec, at the RM's REST API (400, nothing created) and by `elastane ps
submit` (exit 2, nothing sent)."""
from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from appmaster.ps.submission import build_ps_submission
from cli_runner import run_cli as _run
from elastane_cli import main as cli
from elastane_cli import ps_commands
from protocol import ps_job_spec
from protocol.internal_api import NodePlacement, counts_on_nodes
from protocol.ps_job_spec import JobSpecError, validate
import rm_inprocess
from rm_inprocess import BASE, new_application_id

rm = rm_inprocess.rm    # the in-process RM fixture, shared with the other REST-path tests

TWO_NODES = [{"node": "10.0.0.5:45454", "workers": 1, "servers": 1},
             {"node": "worker-host-2", "workers": 1, "servers": 1}]


def _spec(placement: Any, workers: int = 2, servers: int = 2) -> dict[str, Any]:
    return {"app": "mlr", "workers": workers, "servers": servers, "placement": placement}


def test_a_placement_round_trips_and_gives_the_counts_per_node_and_role() -> None:
    spec = validate(_spec([{"node": "10.0.0.5:45454", "workers": 2, "servers": 0},
                           {"node": "worker-host-2", "servers": 2}]))
    assert spec.placement == [NodePlacement("10.0.0.5:45454", 2, 0), NodePlacement("worker-host-2", 0, 2)]
    # A node with none of a role gets no ask for it.
    assert counts_on_nodes(spec.placement, "worker") == {"10.0.0.5:45454": 2}
    assert counts_on_nodes(spec.placement, "server") == {"worker-host-2": 2}
    assert validate(json.dumps(spec.to_json())) == spec
    assert spec.to_json()["placement"][1] == {"node": "worker-host-2", "workers": 0, "servers": 2}
    with pytest.raises(ValueError, match="no executor role 'ps'"):
        counts_on_nodes(spec.placement, "ps")


def test_no_placement_or_an_empty_one_places_nothing() -> None:
    for spec in (validate({"app": "mlr"}), validate(_spec([]))):
        assert spec.placement == []
        assert counts_on_nodes(spec.placement, "worker") == {} and counts_on_nodes(spec.placement, "server") == {}


@pytest.mark.parametrize("placement, message", [
    ([{"node": "", "workers": 2, "servers": 2}],
     "placement[0].node: must not be empty: a node id \"host:port\" or a host name"),
    ([{"node": "  ", "workers": 2, "servers": 2}],
     "placement[0].node: must not be empty: a node id \"host:port\" or a host name"),
    ([{"node": "a:1", "workers": 1, "servers": 1}, {"node": "a:1", "workers": 1, "servers": 1}],
     "placement[1].node: 'a:1' is named twice (placement[0] too): one entry per node"),
    ([{"node": "a:1", "workers": -1, "servers": 2}, {"node": "b:1", "workers": 3}],
     "placement[0].workers: -1 is negative"),
    ([{"node": "a:1", "workers": 2, "servers": -2}], "placement[0].servers: -2 is negative"),
    ([{"node": "a:1", "workers": 1.0, "servers": 2}, {"node": "b:1", "workers": 1}],
     "placement[0].workers: Expected `int`, got `float`"),
    ([{"node": "a:1", "workers": True, "servers": 2}], "placement[0].workers: Expected `int`, got `bool`"),
    ([{"node": "a:1", "workers": 3, "servers": 2}],
     "placement: its workers sum to 3, 1 more than the spec's workers (2)"),
    ([{"node": "a:1", "workers": 2, "servers": 1}],
     "placement: its servers sum to 1, 1 fewer than the spec's servers (2)"),
    ([{"node": "a:1", "workers": 2}], "placement: its servers sum to 0, 2 fewer than the spec's servers (2)"),
    ([{"workers": 2, "servers": 2}], "placement[0].node: required field is missing"),
    ([{"node": 7, "workers": 2, "servers": 2}], "placement[0].node: Expected `str`, got `int`"),
    ([{"node": "a:1", "workers": 2, "servers": 2, "rack": "r1"}], "placement[0].rack: unknown field"),
    ({"node": "a:1", "workers": 2, "servers": 2}, "placement: Expected `array`, got `object`"),
])
def test_a_bad_placement_is_refused_naming_the_entry(placement: Any, message: str) -> None:
    with pytest.raises(JobSpecError) as e:
        validate(_spec(placement))
    assert str(e.value) == message


async def test_the_rm_refuses_a_bad_placement_with_400_and_creates_nothing(rm) -> None:
    _, client = rm
    for placement, field in (([{"node": "a:1", "workers": 3, "servers": 2}], "placement"),
                             ([{"node": "", "workers": 2, "servers": 2}], "placement[0].node")):
        app_id = await new_application_id(client)
        body = build_ps_submission({"app": "mlr"}, app_id=app_id)    # which checks its spec first
        body["elastane"] = {"ps-job": _spec(placement)}
        resp = await client.post(BASE + "/apps", json=body, params={"user.name": "alice"})
        err = await resp.json()
        assert resp.status == 400, err
        assert err["RemoteException"]["message"].startswith(f"elastane.ps-job.{field}:"), err
        apps = await (await client.get(BASE + "/apps")).json()
        assert app_id not in {a["id"] for a in ((apps.get("apps") or {}).get("app") or [])}


async def test_the_rm_passes_a_good_placement_to_the_am(rm) -> None:
    server, client = rm
    app_id = await new_application_id(client)
    resp = await client.post(BASE + "/apps", json=build_ps_submission(_spec(TWO_NODES), app_id=app_id),
                             params={"user.name": "alice"})
    assert resp.status == 202, await resp.text()
    spec = validate(server.core.apps[app_id].am.environment[ps_job_spec.PS_SPEC_ENV])
    assert (counts_on_nodes(spec.placement, "worker") == counts_on_nodes(spec.placement, "server")
            == {"10.0.0.5:45454": 1, "worker-host-2": 1})


# ----- elastane ps submit -------------------------------------------------------------------------

def test_place_flags_and_a_spec_file_give_the_placement(tmp_path) -> None:
    args = cli.build_parser().parse_args(["ps", "submit", "--app", "mlr", "--servers", "2",
                                          "--place", "10.0.0.5:45454=1,1", "--place", "worker-host-2=1,1"])
    spec = ps_commands.validate_spec(*ps_commands.spec_from_args(args))
    assert spec.placement == [NodePlacement("10.0.0.5:45454", 1, 1), NodePlacement("worker-host-2", 1, 1)]
    f = tmp_path / "job.json"
    f.write_text(json.dumps(_spec(TWO_NODES)))
    spec = ps_commands.validate_spec(*ps_commands.spec_from_args(
        cli.build_parser().parse_args(["ps", "submit", "--spec-file", str(f)])))
    assert [p.node for p in spec.placement] == ["10.0.0.5:45454", "worker-host-2"]
    # --place replaces the file's placement as a whole.
    spec = ps_commands.validate_spec(*ps_commands.spec_from_args(cli.build_parser().parse_args(
        ["ps", "submit", "--spec-file", str(f), "--place", "h3=2,2"])))
    assert spec.placement == [NodePlacement("h3", 2, 2)]


@pytest.mark.parametrize("args, message", [
    (["--place", "a:1=1"], "--place expects NODE=WORKERS,SERVERS (e.g. 10.0.0.5:45454=1,1), got 'a:1=1'"),
    (["--place", "a:1"], "--place expects NODE=WORKERS,SERVERS"),
    (["--place", "=1,1"], "--place expects NODE=WORKERS,SERVERS"),
    (["--place", "a:1=x,1"], "--place expects NODE=WORKERS,SERVERS"),
    (["--place", "a:1=1,1"], "invalid PS job spec: placement: its workers sum to 1, 1 fewer than the spec's "
                             "workers (2) (set by --place)"),
    (["--place", "a:1=-1,1", "--place", "b:1=3,0"], "placement[0].workers: -1 is negative (set by --place)"),
    (["--set", 'placement=[{"node": "a:1", "workers": 2, "servers": 1}, {"node": "a:1"}]'],
     "placement[1].node: 'a:1' is named twice"),
])
def test_a_bad_place_flag_exits_2_and_sends_nothing(args: list[str], message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # No RM listens at this URL: reaching it would exit 1, so exit 2 proves nothing was sent.
    code, out, err = _run(["--rm", f"http://127.0.0.1:{port}", "ps", "submit", "--app", "mlr", *args], capsys)
    assert code == 2, err
    assert message in err
    assert "Submitted" not in out
