"""End to end: NMs refuse forged container tokens; the RM refuses bad submissions with a 400
naming the field and changes nothing."""
import json
import urllib.error
import urllib.request

import pytest

from appmaster.distributed_shell import build_submission
from conftest import RestError, rest
from protocol import internal_api as api
from protocol import tokens
from protocol.nm_client import container_token_payload
from protocol.records import Resource

pytestmark = pytest.mark.cluster


def nm_post(http_address: str, path: str, body: dict, token: str) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{http_address}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def nm_containers_text(http_address: str) -> str:
    with urllib.request.urlopen(f"http://{http_address}/ws/v1/node/containers", timeout=15) as r:
        return r.read().decode()


def test_nm_refuses_forged_container_tokens(cluster, tmp_path):
    nm0, nm1 = cluster.nodes[0], cluster.nodes[1]
    marker = tmp_path / "started"
    cid = "container_1_9999_01_000001"
    claims = container_token_payload(cid, nm0.node_id, "application_1_9999", "appattempt_1_9999_000001",
                                      "mallory", Resource(64, 1))
    forged = {
        "wrong secret": tokens.sign("not-the-cluster-secret", tokens.CONTAINER, claims, 600),
        "other node": tokens.sign(cluster.secret, tokens.CONTAINER, dict(claims, node_id=nm1.node_id), 600),
        "expired": tokens.sign(cluster.secret, tokens.CONTAINER, claims, -60),
        "wrong kind": tokens.sign(cluster.secret, tokens.AM, claims, 600),
    }
    for what, tok in forged.items():
        body = {"container_token": tok, "launch_context": {"commands": [f"touch {marker}"]}}
        status, err = nm_post(nm0.http_address, api.CONTAINER_START, body, tok)
        assert status == 401, (what, status, err)
        assert "RemoteException" in err, what
        assert cid not in nm_containers_text(nm0.http_address), what
        assert not marker.exists(), f"a container was started with a token of the {what}"


def _app_ids(cluster) -> set[str]:
    apps = (rest(cluster.rm_url, "GET", "/ws/v1/cluster/apps").get("apps") or {}).get("app") or []
    return {a["id"] for a in apps}


@pytest.mark.parametrize("case,needle", [
    ("malformed json", "json"),
    ("unknown field", "application-nmae"),
    ("negative memory", "memory"),
    ("missing am-container-spec", "am-container-spec"),
])
def test_bad_submission_is_400_naming_the_field_and_changes_nothing(cluster, case, needle):
    before = _app_ids(cluster)
    app_id = rest(cluster.rm_url, "POST", "/ws/v1/cluster/apps/new-application", user="alice")["application-id"]
    sub = build_submission("bad", ["true"], 1, 64, 1, app_id=app_id)
    raw = None
    if case == "malformed json":
        raw = json.dumps(sub).encode()[:-7]
    elif case == "unknown field":
        sub["application-nmae"] = sub.pop("application-name")
    elif case == "negative memory":
        sub["resource"]["memory"] = -128
    else:
        del sub["am-container-spec"]
    with pytest.raises(RestError) as e:
        rest(cluster.rm_url, "POST", "/ws/v1/cluster/apps", sub, user="alice", raw=raw)
    assert e.value.status == 400
    remote = e.value.body["RemoteException"]
    assert remote["exception"] == "BadRequestException" and "javaClassName" in remote
    assert needle.lower() in remote["message"].lower(), remote["message"]
    assert _app_ids(cluster) == before
    with pytest.raises(RestError) as e:
        rest(cluster.rm_url, "GET", f"/ws/v1/cluster/apps/{app_id}")
    assert e.value.status == 404
