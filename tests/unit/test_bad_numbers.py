"""Bad input never persists: integers past 64 bits and non-finite numbers are refused by the codec
with a 400 naming the field, and a stored app that cannot be encoded leaves GET /apps answering
with the others (the bad one listed by its error marker)."""
from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from appmaster.ps.submission import build_ps_submission
from protocol import codec
import rm_inprocess
from rm_inprocess import BASE, new_application_id

rm = rm_inprocess.rm    # the in-process RM fixture, shared with the other REST-path tests


async def _submit_raw(client: TestClient, raw: bytes) -> tuple[int, Any]:
    resp = await client.post(BASE + "/apps", data=raw, params={"user.name": "alice"},
                             headers={"Content-Type": "application/json"})
    return resp.status, (await resp.json() if resp.content_type == "application/json" else None)


async def _listing(client: TestClient) -> tuple[int, list[dict[str, Any]]]:
    resp = await client.get(BASE + "/apps")
    body = await resp.json()
    return resp.status, ((body.get("apps") or {}).get("app") or [])


def _body(app_id: str, learning_rate: str) -> bytes:
    """A PS submission whose hparams.learning_rate is the JSON text `learning_rate`."""
    body = build_ps_submission({"app": "mlr"}, app_id=app_id)
    body["elastane"] = {"ps-job": {"app": "mlr", "hparams": {"learning_rate": "@LR@"}}}
    return codec.dumps(body).replace(b'"@LR@"', learning_rate.encode())


@pytest.mark.parametrize("number, says", [
    ("18446744073709551616", "outside the 64-bit range"),
    ("-9223372036854775809", "outside the 64-bit range"),
    ("1e400", "not finite"),
])
async def test_out_of_range_hparam_is_400_naming_the_field_and_nothing_is_stored(rm, number: str,
                                                                                says: str) -> None:
    server, client = rm
    app_id = await new_application_id(client)
    status, err = await _submit_raw(client, _body(app_id, number))
    assert status == 400, err
    assert err["RemoteException"]["exception"] == "BadRequestException"
    message = err["RemoteException"]["message"]
    assert message.startswith("elastane.ps-job.hparams.learning_rate:") and says in message, message
    assert app_id not in server.core.apps
    status, apps = await _listing(client)
    assert status == 200 and app_id not in {a["id"] for a in apps}


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
async def test_nan_and_infinity_are_refused(rm, number: str) -> None:
    server, client = rm
    app_id = await new_application_id(client)
    status, err = await _submit_raw(client, _body(app_id, number))
    assert status == 400, err
    assert "non-finite number" in err["RemoteException"]["message"]
    assert app_id not in server.core.apps


async def test_largest_64_bit_integers_are_still_accepted(rm) -> None:
    server, client = rm
    app_id = await new_application_id(client)
    body = build_ps_submission({"app": "mlr"}, app_id=app_id)
    body["elastane"]["ps-job"]["checkpoint_every_epochs"] = 2 ** 63 - 1
    body["application-tags"] = [2 ** 64 - 1, -(2 ** 63)]     # accepted and ignored
    status, err = await _submit_raw(client, codec.dumps(body))
    assert status == 202, err
    assert app_id in server.core.apps


async def test_a_stored_app_that_cannot_be_encoded_does_not_take_the_listing_down(rm) -> None:
    server, client = rm
    ids = []
    for _ in range(3):
        app_id = await new_application_id(client)
        status, err = await _submit_raw(client, codec.dumps(build_ps_submission({"app": "mlr"}, app_id=app_id)))
        assert status == 202, err
        ids.append(app_id)
    bad = ids[1]
    # a record from before the codec refused it (or corrupted since): its extension holds 2^64
    server.core.apps[bad].extension = {"note": {"learning_rate": 2 ** 64}}
    status, apps = await _listing(client)
    assert status == 200
    by_id = {a["id"]: a for a in apps}
    assert set(by_id) == set(ids)
    assert "renderError" in by_id[bad] and by_id[bad]["state"]
    assert all("renderError" not in by_id[i] for i in ids if i != bad)
    resp = await client.get(f"{BASE}/apps/{bad}")
    assert resp.status == 200 and "renderError" in (await resp.json())["app"]


def test_codec_names_the_path_inside_lists() -> None:
    with pytest.raises(codec.DecodeError, match=r"^a\[1\]\.b: integer"):
        codec.loads(b'{"a": [0, {"b": 18446744073709551616}]}')
    assert codec.loads(b'{"a": 18446744073709551615, "b": -9223372036854775808, "c": 1e-400}') == {
        "a": 2 ** 64 - 1, "b": -(2 ** 63), "c": 0.0}
