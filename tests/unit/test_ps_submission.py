"""The REST path of a PS job: the RM validates `elastane.ps-job` at submission (400 naming the
field, nothing created), fills in the PS AM command when the submission has none, and passes the
validated spec to the AM in its env. In-process RM (aiohttp TestServer, fake clock)."""
from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from appmaster.ps.submission import build_ps_submission
from protocol import ps_job_spec
import rm_inprocess
from rm_inprocess import BASE, new_application_id

rm = rm_inprocess.rm    # the in-process RM fixture, shared with the other REST-path tests


async def _submit(client: TestClient, body: dict[str, Any]) -> tuple[int, Any]:
    resp = await client.post(BASE + "/apps", json=body, params={"user.name": "alice"})
    return resp.status, (await resp.json() if resp.content_type == "application/json" else None)


async def _app_ids(client: TestClient) -> set[str]:
    body = await (await client.get(BASE + "/apps")).json()
    return {a["id"] for a in ((body.get("apps") or {}).get("app") or [])}


@pytest.mark.parametrize("ps_job, field", [
    ({"app": "mlr", "hparams": {"learning_rate": -1}}, "elastane.ps-job.hparams.learning_rate"),
    ({"app": "mlr", "workers": 0}, "elastane.ps-job.workers"),
    ({"app": "kmeans"}, "elastane.ps-job.app"),
    ({"app": "nmf", "data": {"rank": 0}}, "elastane.ps-job.data.rank"),
    ({"app": "lda", "surprise": 1}, "elastane.ps-job.surprise"),
    ({"app": "mlr", "early_stopping": 0}, "elastane.ps-job.early_stopping"),
    ({"app": "mlr", "early_stopping": 4, "heldout_every_epochs": 0}, "elastane.ps-job.early_stopping"),
    ({"app": "mlr", "weight": -1}, "elastane.ps-job.weight"),
    ({"app": "mlr", "workers": 2, "min_workers": 3}, "elastane.ps-job.min_workers"),
    ("mlr", "elastane.ps-job"),
    # locations the RM would read at submission, of schemes it does not read (no request is made)
    ({"app": "mlr", "init_from": "ftp://10.0.0.1/m"}, "elastane.ps-job.init_from"),
    ({"app": "mlr", "data": {"path": "memory://d"}}, "elastane.ps-job.data.path"),
    ({"app": "mlr", "init_from": "s3://b/m::http://10.0.0.1/m"}, "elastane.ps-job.init_from"),
])
async def test_bad_ps_job_is_400_naming_the_field_and_creates_nothing(rm, ps_job: Any, field: str) -> None:
    _, client = rm
    app_id = await new_application_id(client)
    body = build_ps_submission({"app": "mlr"}, app_id=app_id)
    body["elastane"] = {"ps-job": ps_job}
    status, err = await _submit(client, body)
    assert status == 400, err
    message = err["RemoteException"]["message"]
    assert message.startswith(field + ":") or message.startswith(field + " "), message
    assert err["RemoteException"]["exception"] == "BadRequestException"
    assert app_id not in await _app_ids(client)


async def test_ps_type_needs_the_spec_and_the_spec_needs_the_type(rm) -> None:
    _, client = rm
    body = build_ps_submission({"app": "mlr"}, app_id=await new_application_id(client))
    del body["elastane"]
    status, err = await _submit(client, body)
    assert status == 400 and "elastane.ps-job is required" in err["RemoteException"]["message"]
    body = build_ps_submission({"app": "mlr"}, app_id=await new_application_id(client))
    body["application-type"] = "YARN"
    status, err = await _submit(client, body)
    assert status == 400 and "application-type ELASTANE_PS" in err["RemoteException"]["message"]
    assert not await _app_ids(client)


async def test_good_ps_job_without_command_gets_the_ps_am_and_its_spec(rm) -> None:
    server, client = rm
    app_id = await new_application_id(client)
    body = {"application-id": app_id, "application-name": "mlr-job", "application-type": "ELASTANE_PS",
            "am-container-spec": {}, "resource": {"memory": 512, "vCores": 1},
            "elastane": {"ps-job": {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 3}}}
    status, err = await _submit(client, body)
    assert status == 202, err
    assert app_id in await _app_ids(client)
    am = server.core.apps[app_id].am
    assert am.commands == [ps_job_spec.AM_COMMAND]
    spec = ps_job_spec.validate(am.environment[ps_job_spec.PS_SPEC_ENV])
    assert spec.app == "mlr" and spec.servers == 2 and spec.max_epochs == 3 and spec.num_blocks == 8


async def test_other_apps_still_need_a_command(rm) -> None:
    _, client = rm
    body = {"application-id": await new_application_id(client), "am-container-spec": {},
            "resource": {"memory": 512, "vCores": 1}}
    status, err = await _submit(client, body)
    assert status == 400 and err["RemoteException"]["message"] == "am-container-spec.commands is required"


async def test_a_ps_jobs_files_in_either_place_reach_the_am_and_its_executors(rm) -> None:
    """A YARN client ships files in am-container-spec.local-resources only, Elastane's CLI in
    ps-job.resources: either way the AM's container localizes them and the spec the AM runs (whose
    resources it passes to every executor) has them all; one name given two ways is a 400."""
    server, client = rm
    yarn_way = {"resource": "file:///shared/app/mymodel.py", "type": "FILE", "visibility": "APPLICATION",
                "size": 10, "timestamp": 1764130000000}
    ours = {"resource": "/shared/app/digits.npz", "type": "FILE"}
    app_id = await new_application_id(client)
    body = {"application-id": app_id, "application-name": "user-job", "application-type": "ELASTANE_PS",
            "am-container-spec": {"local-resources": {"entry": [{"key": "mymodel.py", "value": yarn_way}]}},
            "resource": {"memory": 512, "vCores": 1},
            "elastane": {"ps-job": {"app": "mymodel:MyApp", "resources": {"digits.npz": ours}}}}
    status, err = await _submit(client, body)
    assert status == 202, err
    am = server.core.apps[app_id].am
    spec = ps_job_spec.validate(am.environment[ps_job_spec.PS_SPEC_ENV])
    assert sorted(spec.resources) == ["digits.npz", "mymodel.py"]
    assert spec.resources["mymodel.py"].resource == yarn_way["resource"] and spec.resources["mymodel.py"].size == 10
    assert sorted(am.local_resources) == ["digits.npz", "mymodel.py"]
    assert am.local_resources["digits.npz"].resource == ours["resource"]

    app_id = await new_application_id(client)
    body["application-id"] = app_id
    body["elastane"]["ps-job"]["resources"]["mymodel.py"] = {**yarn_way, "size": 11}
    status, err = await _submit(client, body)
    assert status == 400, err
    message = err["RemoteException"]["message"]
    assert message.startswith("am-container-spec.local-resources: local resource 'mymodel.py' differs from "
                              "elastane.ps-job.resources.mymodel.py"), message
    assert app_id not in await _app_ids(client)


async def test_the_rm_reads_no_url_a_client_names_outside_paths_and_object_stores(rm) -> None:
    """init_from / data.path of http:// (any scheme but a path, file:// or an object store): a
    400 naming the field and the scheme, and no request from the RM (it would fetch, from inside
    the cluster's network, what a client chose -- a metadata service -- and echo its structure)."""
    _, client = rm
    hits: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.json_response({"app": "mlr", "format": 1, "spec": {"num_samples": "SECRET"}})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    internal = TestServer(app)
    await internal.start_server()
    try:
        url = str(internal.make_url("/latest/meta-data"))
        for ps_job, field in (({"app": "mlr", "init_from": url}, "init_from"),
                              ({"app": "mlr", "data": {"path": url}}, "data.path")):
            app_id = await new_application_id(client)
            body = build_ps_submission({"app": "mlr"}, app_id=app_id)
            body["elastane"] = {"ps-job": ps_job}
            status, err = await _submit(client, body)
            assert status == 400, err
            message = err["RemoteException"]["message"]
            assert message.startswith(f"elastane.ps-job.{field}: ") and "http://" in message, message
            assert "SECRET" not in message and hits == []
            assert app_id not in await _app_ids(client)
    finally:
        await internal.close()
    # A path is still read (here: none there, left to the AM, which reads it where it runs).
    body = build_ps_submission({"app": "mlr", "init_from": "/nowhere/on/this/host"},
                               app_id=await new_application_id(client))
    status, err = await _submit(client, body)
    assert status == 202, err
