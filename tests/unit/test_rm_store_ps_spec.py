"""The RM keeps a PS job's spec typed from submission on: the app record holds the decoded
PSJobSpec (App.ps), the state store writes it as its msgspec encoding and decodes it once on
recovery, and documents written before (the spec raw inside the extension) still load."""
from __future__ import annotations

import json
import sqlite3

import msgspec
import pytest

from protocol import ps_job_spec
from protocol.ps_job_spec import PSJobSpec
from protocol.records import Resource
from protocol.remote_exception import BadRequest
from rm.model import AmSpec
from rm.rest_views import app_json
from rm.store import SqliteStateStore, app_from_record, app_to_record, attempt_from_record, attempt_to_record
from rm_testing import make_core, ps_spec, register

SPEC = {"app": "mlr", "workers": 3, "servers": 2, "max_workers": 5, "executor_memory_mb": 300,
        "executor_vcores": 2, "hparams": {"learning_rate": 0.5}, "max_epochs": 7}


def submit_ps(core, spec: PSJobSpec, extension: dict | None = None) -> str:
    app_id = core.new_application()
    core.submit(app_id, "alice", "ps", "default", ps_job_spec.APPLICATION_TYPE,
                AmSpec(["true"], {}, {}, Resource(512, 1)), 1, ps_job=spec, extension=extension)
    core.app_saved(app_id)
    return app_id


def save(store: SqliteStateStore, core) -> None:
    for app in core.apps.values():
        store.save_app(app_to_record(app), [attempt_to_record(core.attempts[a]) for a in app.attempts])


def stored_doc(store: SqliteStateStore) -> dict:
    """The one app document on disk, as JSON."""
    db = sqlite3.connect(store.path)
    try:
        (doc,) = db.execute("SELECT doc FROM apps").fetchone()
    finally:
        db.close()
    return json.loads(doc)


def recovered(store: SqliteStateStore, minimum_allocation_mb: int = 256):
    core = make_core(minimum_allocation_mb=minimum_allocation_mb)
    for rec, attempts in store.load():
        core.recover(app_from_record(rec, core.scheduler.min_mb), [attempt_from_record(a) for a in attempts])
    return core


def test_the_app_record_holds_the_typed_spec_and_the_store_keeps_it_typed(tmp_path) -> None:
    core = make_core(minimum_allocation_mb=256)
    register(core, "n1:1")
    spec = ps_spec(SPEC)
    app_id = submit_ps(core, spec, extension={"note": "kept"})
    app = core.apps[app_id]
    assert app.ps is not None and app.ps.spec is spec and app.extension == {"note": "kept"}
    assert app.ps.executor == Resource(512, 2) and app.ps.max_epochs == 7

    store = SqliteStateStore(tmp_path)
    save(store, core)
    stored = stored_doc(store)
    assert stored["ps_job"] == msgspec.to_builtins(spec)            # the spec's msgspec encoding
    assert stored["elastane"] == {"note": "kept"} and "submission" not in stored

    again = recovered(store).apps[app_id]
    assert again.ps is not None and again.ps.spec == spec and again.ps.executor == Resource(512, 2)
    assert again.extension == {"note": "kept"}
    store.close()


def test_rest_shows_the_spec_under_ps_job_and_the_rest_of_the_extension_as_given() -> None:
    core = make_core()
    register(core, "n1:1")
    ps = submit_ps(core, ps_spec(SPEC), extension={"note": "kept"})
    elastane = app_json(core, core.apps[ps])["elastane"]
    assert list(elastane) == [ps_job_spec.ELASTANE_FIELD, "note"]
    assert ps_job_spec.validate(elastane[ps_job_spec.ELASTANE_FIELD]) == ps_job_spec.validate(SPEC)
    assert {k: elastane[ps_job_spec.ELASTANE_FIELD][k] for k in SPEC} == SPEC   # what was given, as given

    other = core.new_application()
    core.submit(other, "bob", "yarn", "default", "YARN", AmSpec(["true"], {}, {}, Resource(512, 1)), 1,
                extension={"workers": 2})
    assert app_json(core, core.apps[other])["elastane"] == {"workers": 2}
    plain = core.new_application()
    core.submit(plain, "bob", "yarn", "default", "YARN", AmSpec(["true"], {}, {}, Resource(512, 1)), 1)
    assert "elastane" not in app_json(core, core.apps[plain])


def test_a_spec_on_an_app_that_is_no_ps_job_is_refused_and_nothing_changes() -> None:
    core = make_core()
    app_id = core.new_application()
    with pytest.raises(BadRequest, match="ps-job needs application-type ELASTANE_PS"):
        core.submit(app_id, "bob", "yarn", "default", "YARN", AmSpec(["true"], {}, {}, Resource(512, 1)), 1,
                    ps_job=ps_spec(SPEC))
    assert core.apps == {} and app_id in core.reserved_ids


def _old_row(tmp_path, elastane: dict) -> str:
    """Write an app document as RMs wrote them before the spec was kept typed: the whole request
    in `submission`, the raw spec inside `elastane`, no `ps_job`."""
    store = SqliteStateStore(tmp_path)
    store.close()
    app_id = "application_1700000000000_0001"
    doc = {"app_id": app_id, "user": "alice", "name": "old", "queue": "default", "app_type": "ELASTANE_PS",
           "am_commands": ["true"], "am_environment": {}, "am_local_resources": {},
           "am_resource": {"memory": 512, "vCores": 1}, "max_attempts": 1, "submit_time": 1.0, "seq": 1,
           "submission": {"application-id": app_id, "elastane": elastane}, "state": "ACCEPTED",
           "final_status": "UNDEFINED", "elastane": elastane}
    db = sqlite3.connect(tmp_path / "state.db")
    with db:
        db.execute("INSERT INTO apps VALUES (?, ?, ?)", (app_id, 1, json.dumps(doc).encode()))
    db.close()
    return app_id


def test_an_app_stored_with_its_spec_raw_still_loads_with_the_spec_typed(tmp_path) -> None:
    app_id = _old_row(tmp_path, {"ps-job": SPEC, "note": "kept"})
    store = SqliteStateStore(tmp_path)
    core = recovered(store)
    app = core.apps[app_id]
    assert app.ps is not None and app.ps.spec == ps_spec(SPEC)
    assert app.ps.executor == Resource(512, 2) and app.ps.max_workers == 5
    assert app.extension == {"note": "kept"}
    # written back, it is a document of today's form
    save(store, core)
    stored = stored_doc(store)
    assert stored["ps_job"]["workers"] == 3 and stored["elastane"] == {"note": "kept"}
    assert "submission" not in stored
    store.close()


def test_an_old_raw_spec_that_no_longer_decodes_stays_raw_and_the_app_is_no_ps_job(tmp_path) -> None:
    raw = {"ps-job": {"app": "mlr", "workers": "many"}}
    app_id = _old_row(tmp_path, raw)
    store = SqliteStateStore(tmp_path)
    core = recovered(store)
    app = core.apps[app_id]
    assert app.ps is None and app.extension == raw
    assert app_json(core, app)["elastane"] == raw     # shown as it was stored
    store.close()
