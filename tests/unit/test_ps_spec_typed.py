"""A PS job spec's data and hparams decoded once into the app's Spec / HParams (issue 35 part 6):
`PSJobSpec.typed_data` / `typed_hparams`, kept beside the JSON fields, which stay what is stored,
sent and shown; the readers (the app registry, the policies' view, the CLI) take the typed ones."""
from __future__ import annotations

from collections.abc import Mapping

import msgspec
import pytest

from elastane_cli import ps_reports
from protocol import ps_job_spec
from protocol.dataset_manifest import resolve_data_spec
from protocol.json_types import JsonObject, JsonValue
from protocol.ps_app_schemas import APP_SCHEMAS, LDAHParams, LDASpec, MLRHParams, MLRSpec
from protocol.ps_job_spec import JobSpecError, PSJobSpec, validate
from psruntime.apps.base import AppConfigError
from psruntime.apps.registry import create_job_app
from rm.policies import ps_job_view


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The apps whose data spec the spec module resolved (read preset and dataset dims), in order."""
    seen: list[str] = []

    def counting(app: str, data: Mapping[str, JsonValue], base: Mapping[str, JsonValue]) -> JsonObject:
        seen.append(app)
        return resolve_data_spec(app, data, base)

    monkeypatch.setattr(ps_job_spec, "resolve_data_spec", counting)
    return seen


def test_validate_decodes_a_builtin_apps_data_and_hparams_into_its_structs() -> None:
    spec = validate({"app": "mlr", "data": {"num_samples": 4000}, "hparams": {"learning_rate": 0.3},
                     "max_epochs": 7})
    data, hp = spec.typed_data, spec.typed_hparams
    assert isinstance(data, MLRSpec) and isinstance(hp, MLRHParams)
    # the preset, then the job's fields, then the Struct's defaults for what neither sets
    tiny = APP_SCHEMAS["mlr"].presets["tiny"]
    assert (data.num_samples, data.num_features, data.num_classes) == (4000, tiny["num_features"], MLRSpec().num_classes)
    assert (hp.learning_rate, hp.max_epochs, hp.lr_decay) == (0.3, 7, APP_SCHEMAS["mlr"].preset_hparams["tiny"]["lr_decay"])
    assert hp.batch_size == MLRHParams().batch_size
    # kept: every read is the same object
    assert spec.typed_data is data and spec.typed_hparams is hp
    assert (spec.effective_max_epochs, spec.effective_convergence_threshold) == (7, hp.convergence_threshold)


def test_the_data_spec_is_resolved_once_across_validate_the_readers_and_the_app(calls: list[str]) -> None:
    spec = validate({"app": "lda", "data": {"num_docs": 400}, "hparams": {"alpha": 0.2}})
    assert calls == ["lda"]
    app = create_job_app(spec)
    ps_job_view(spec)
    ps_reports.max_epochs_of(spec)
    # the JSON form an executor's setup carries: a copy each time, of what was resolved once
    first = spec.app_data()
    first["num_docs"] = 1
    assert spec.app_data()["num_docs"] == 400
    assert calls == ["lda"]                      # no reader decoded the dicts again
    # the app holds the spec's own Structs, taken as they are
    assert app.spec is spec.typed_data and app.hparams is spec.typed_hparams
    assert isinstance(app.spec, LDASpec) and app.spec.num_docs == 400
    assert isinstance(app.hparams, LDAHParams) and app.hparams.alpha == 0.2


def test_the_json_form_is_the_fields_only_and_round_trips() -> None:
    raw = {"app": "nmf", "preset": "tiny", "data": {"num_users": 800}, "hparams": {"rank": 4}, "max_epochs": 5}
    spec = validate(raw)
    assert spec.typed_data is not None and spec.typed_hparams is not None      # decoded and kept ...
    out = spec.to_json()
    assert set(out) == set(PSJobSpec.__struct_fields__)                        # ... but not encoded
    assert (out["data"], out["hparams"]) == (raw["data"], raw["hparams"])      # as the user gave them
    assert msgspec.json.decode(msgspec.json.encode(spec)) == out
    assert validate(msgspec.json.encode(spec)) == spec


def test_a_stored_spec_decoded_without_validate_is_typed_on_first_read() -> None:
    # What an RM store of an earlier version holds: the spec's JSON object, decoded as rm/store.py does.
    stored = {"app": "mlr", "preset": "tiny", "data": {"num_samples": 3000}, "hparams": {"l2": 0.001},
              "workers": 2, "servers": 1, "sync": "bsp"}
    spec = msgspec.convert(stored, PSJobSpec, strict=False)
    assert spec.typed_data == validate(stored).typed_data
    assert spec.typed_hparams == validate(stored).typed_hparams
    assert isinstance(spec.typed_hparams, MLRHParams) and spec.typed_hparams.l2 == 0.001


def test_the_policy_view_of_a_stored_spec_does_not_read_its_dataset() -> None:
    # The dataset directory is where the cluster's nodes read it, not necessarily on the RM's host:
    # the view needs the hyper-parameters only.
    spec = msgspec.convert({"app": "mlr", "data": {"path": "/nowhere/on/this/host"}}, PSJobSpec)
    view = ps_job_view(spec)
    assert view.max_epochs == APP_SCHEMAS["mlr"].preset_hparams["tiny"]["max_epochs"]
    with pytest.raises(JobSpecError, match=r"^data\.path"):
        spec.typed_data                                                      # noqa: B018 (the read decodes)


def test_hparams_that_do_not_decode_are_named_and_the_readers_cope() -> None:
    spec = PSJobSpec(app="mlr", hparams={"learning_rate": 0}, max_epochs=4)      # made without validate
    with pytest.raises(JobSpecError, match=r"^hparams\.learning_rate: Expected `float` > 0\.0"):
        spec.typed_hparams                                                   # noqa: B018 (the read decodes)
    with pytest.raises(AppConfigError, match="hparams.learning_rate"):
        create_job_app(spec)
    view = ps_job_view(spec)                      # the job-level limits still reach the policies
    assert (view.max_epochs, view.convergence_threshold) == (4, None)
    with pytest.raises(JobSpecError, match=r"^hparams\.learning_rate"):
        validate(spec)


def test_the_spec_is_frozen_and_a_changed_copy_decodes_anew() -> None:
    spec = validate({"app": "mlr", "hparams": {"learning_rate": 0.3}})
    with pytest.raises(AttributeError):
        spec.hparams = {"learning_rate": 0.9}          # type: ignore[misc]
    changed = msgspec.structs.replace(spec, hparams={"learning_rate": 0.9})
    assert isinstance(changed.typed_hparams, MLRHParams) and changed.typed_hparams.learning_rate == 0.9
    assert isinstance(spec.typed_hparams, MLRHParams) and spec.typed_hparams.learning_rate == 0.3


def test_a_user_apps_typed_pair_is_its_apps_not_the_specs() -> None:
    spec = validate({"app": "mymod:MyApp", "data": {"rows": 10}, "hparams": {"max_epochs": 12.0,
                                                                              "convergence_threshold": 0.01}})
    assert spec.typed_data is None and spec.typed_hparams is None and spec.schema is None
    assert (spec.effective_max_epochs, spec.effective_convergence_threshold) == (12, 0.01)
    bare = validate({"app": "mymod:MyApp", "hparams": {"max_epochs": True}})
    assert bare.effective_max_epochs is None              # not a number: unknown without the class


def test_the_rms_submission_keeps_what_validate_decoded(calls: list[str]) -> None:
    from rm import submission   # noqa: PLC0415 (the RM's own submission path)

    shipped = {"resource": "/shared/extra.txt", "type": "FILE", "size": 3, "timestamp": 1}
    ctx = msgspec.convert({
        "application-id": "application_1_0001", "application-type": "ELASTANE_PS",
        "resource": {"memory": 512, "vCores": 1},
        # the AM's local resources are merged into the spec's (a new spec, its decoded parts kept)
        "am-container-spec": {"local-resources": {"entry": [{"key": "extra.txt", "value": shipped}]}},
        "elastane": {"ps-job": {"app": "mlr", "data": {"num_samples": 3000}, "hparams": {"l2": 0.01}}},
    }, submission.SubmissionContext)
    valid = submission.validate(ctx)
    spec = valid.ps_job
    assert spec is not None and "extra.txt" in spec.resources
    assert calls == ["mlr"]
    assert isinstance(spec.typed_data, MLRSpec) and spec.typed_data.num_samples == 3000
    assert isinstance(spec.typed_hparams, MLRHParams) and spec.typed_hparams.l2 == 0.01
    assert calls == ["mlr"]                      # read from what validate decoded, not decoded again
    # what the AM is sent is the JSON form, as before
    sent = msgspec.json.decode(valid.am.environment[ps_job_spec.PS_SPEC_ENV])
    assert sent["data"] == {"num_samples": 3000} and sent["hparams"] == {"l2": 0.01}
