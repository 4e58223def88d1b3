"""The PS job spec (protocol.ps_job_spec): a good spec and its derived values, and every kind of
bad field rejected with a message that names it; plus the client-side submission builder."""
from __future__ import annotations

import json

import msgspec
import pytest

from appmaster.ps.submission import build_ps_submission
from protocol import ps_job_spec
from protocol.ps_app_schemas import APP_SCHEMAS
from protocol.ps_job_spec import JobSpecError, PSJobSpec, validate
from psruntime.apps.registry import get_app


def test_good_spec_with_defaults_and_derived_values() -> None:
    spec = validate({"app": "mlr", "workers": 2, "servers": 2, "data": {"num_samples": 4000},
                     "hparams": {"learning_rate": 0.3}, "max_epochs": 7, "convergence_threshold": 0.01})
    assert spec.preset == "tiny" and spec.sync == "bsp" and spec.ssp_staleness == 0
    assert spec.num_blocks == 2 * ps_job_spec.BLOCKS_PER_SERVER
    assert spec.app_data() == {**APP_SCHEMAS["mlr"].presets["tiny"], "num_samples": 4000}
    assert validate({"app": "mlr", "preset": "small"}).app_data()["num_features"] == 500
    # the preset's hyper-parameters, the job's hparams over them, the job-level limits over both
    assert spec.app_hparams() == {**APP_SCHEMAS["mlr"].preset_hparams["tiny"], "learning_rate": 0.3,
                                  "max_epochs": 7, "convergence_threshold": 0.01}
    assert spec.heldout_every_epochs == 2 and spec.early_stopping is None
    # JSON bytes and an already valid spec round-trip to the same thing
    assert validate(json.dumps(spec.to_json()).encode()) == spec
    assert validate(spec) == spec


def test_dorm_submission_fields_default_and_round_trip() -> None:
    spec = validate({"app": "mlr"})
    assert (spec.weight, spec.min_workers, spec.min_servers) == (1.0, 1, 1)
    spec = validate({"app": "mlr", "workers": 3, "servers": 2, "min_workers": 2, "min_servers": 2,
                     "max_workers": 4, "weight": 2.5})
    assert (spec.weight, spec.min_workers, spec.min_servers, spec.max_workers) == (2.5, 2, 2, 4)
    assert validate(spec.to_json()) == spec


def test_ssp_defaults_and_max_servers_drive_blocks() -> None:
    spec = validate({"app": "lda", "sync": "ssp", "servers": 1, "max_servers": 3})
    assert spec.ssp_staleness == 2
    assert spec.num_blocks == 3 * ps_job_spec.BLOCKS_PER_SERVER


@pytest.mark.parametrize("bad, field", [
    ({"workers": 2}, "app"),
    ({"app": "svm"}, "app"),
    ({"app": "mlr", "preset": "huge"}, "preset"),
    ({"app": "mlr", "workers": 0}, "workers"),
    ({"app": "mlr", "workers": "two"}, "workers"),
    ({"app": "mlr", "servers": -1}, "servers"),
    ({"app": "mlr", "servers": 3, "blocks": 2}, "blocks"),
    # more blocks than any job may have (the AM's ownership frame could not carry 2M of them)
    ({"app": "mlr", "blocks": 2_000_000}, "blocks"),
    ({"app": "mlr", "max_servers": 400_000}, "max_servers"),
    ({"app": "mlr", "use_arbiter": True, "comp_threads": 70_000}, "comp_threads"),    # the arbiter's u16
    ({"app": "mlr", "sync_batches": 1000, "clock_batches": 2}, "sync_batches"),      # a window must fit a clock
    ({"app": "mlr", "workers": 3, "max_workers": 2}, "max_workers"),
    ({"app": "mlr", "servers": 2, "max_servers": 1}, "max_servers"),
    ({"app": "mlr", "sync": "async"}, "sync"),
    ({"app": "mlr", "sync": "bsp", "staleness": 2}, "staleness"),
    ({"app": "mlr", "sync": "ssp", "staleness": 0}, "staleness"),
    ({"app": "mlr", "max_epochs": 0}, "max_epochs"),
    ({"app": "mlr", "convergence_threshold": 0}, "convergence_threshold"),
    ({"app": "mlr", "executor_memory_mb": 10}, "executor_memory_mb"),
    ({"app": "mlr", "checkpoint_every_epochs": -1}, "checkpoint_every_epochs"),
    ({"app": "mlr", "optimizer": "grid"}, "optimizer"),
    ({"app": "mlr", "elastic_mode": "pause"}, "elastic_mode"),
    ({"app": "mlr", "wokers": 2}, "wokers"),
    ({"app": "mlr", "hparams": {"learning_rate": 0}}, "hparams.learning_rate"),
    ({"app": "mlr", "hparams": {"lr": 0.1}}, "hparams.lr"),
    ({"app": "nmf", "hparams": {"rank": "five"}}, "hparams.rank"),
    ({"app": "lda", "data": {"num_docs": 0}}, "data.num_docs"),
    ({"app": "lasso", "data": {"support_size": 10_000}}, "data"),
    ({"app": "mlr", "data": {"colour": "red"}}, "data.colour"),
    ({"app": "mlr", "data": "big"}, "data"),
    ({"app": "mlr", "workers": 9}, "workers"),      # tiny MLR has 8 input blocks
    ({"app": "mlr", "early_stopping": 0}, "early_stopping"),
    ({"app": "mlr", "early_stopping": "3"}, "early_stopping"),
    ({"app": "mlr", "early_stopping": 3, "heldout_every_epochs": 0}, "early_stopping"),
    ({"app": "mlr", "early_stopping": 1, "heldout_every_epochs": 2}, "early_stopping"),
    ({"app": "mlr", "heldout_every_epochs": -1}, "heldout_every_epochs"),
    ({"app": "mlr", "weight": 0}, "weight"),
    ({"app": "mlr", "weight": "heavy"}, "weight"),
    ({"app": "mlr", "min_workers": 0}, "min_workers"),
    ({"app": "mlr", "workers": 2, "min_workers": 3}, "min_workers"),
    ({"app": "mlr", "servers": 1, "min_servers": 2}, "min_servers"),
])
def test_bad_field_is_named(bad: dict, field: str) -> None:
    with pytest.raises(JobSpecError) as e:
        validate(bad)
    assert e.value.field == field, str(e.value)
    assert str(e.value).startswith(f"{field}: "), str(e.value)


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"mlr"'])
def test_not_an_object_is_refused(raw: bytes) -> None:
    with pytest.raises(JobSpecError) as e:
        validate(raw)
    assert e.value.field == ""


def test_error_under_a_prefix_names_the_full_path() -> None:
    with pytest.raises(JobSpecError) as e:
        validate({"app": "mlr", "hparams": {"batch_size": 0}})
    assert str(e.value.under("elastane.ps-job")).startswith("elastane.ps-job.hparams.batch_size: ")


def test_apps_use_the_protocol_schemas() -> None:
    for name, schema in APP_SCHEMAS.items():
        cls = get_app(name)
        assert cls.Spec is schema.spec and cls.HParams is schema.hparams and cls.PRESETS is schema.presets
        assert cls.PRESET_HPARAMS is schema.preset_hparams and set(schema.preset_hparams) == set(schema.presets)
        assert set(schema.presets) == set(ps_job_spec.PRESET_NAMES)


def test_build_ps_submission_carries_the_spec_twice() -> None:
    sub = build_ps_submission({"app": "nmf", "workers": 2}, name="nmf-job", queue="research", am_memory=384,
                              app_id="application_1_0001")
    assert sub["application-id"] == "application_1_0001" and sub["application-type"] == "ELASTANE_PS"
    assert sub["queue"] == "research" and sub["resource"] == {"memory": 384, "vCores": 1}
    assert sub["am-container-spec"]["commands"]["command"] == ps_job_spec.AM_COMMAND
    env = {e["key"]: e["value"] for e in sub["am-container-spec"]["environment"]["entry"]}
    assert validate(env[ps_job_spec.PS_SPEC_ENV]) == validate(sub["elastane"]["ps-job"]) == \
        PSJobSpec(app="nmf", workers=2)
    with pytest.raises(JobSpecError, match="^workers: "):
        build_ps_submission({"app": "nmf", "workers": 0})
    with pytest.raises(ValueError, match="am_memory"):
        build_ps_submission({"app": "nmf"}, am_memory=0)


def test_untrusted_specs_name_only_paths_file_urls_and_object_stores_to_read() -> None:
    """What the RM reads at submission (init_from's model, data.path's dataset.json) must be a
    path, file:// or an object store: any other scheme is refused naming the field and the scheme,
    before anything is read."""
    for url in ("/shared/models/m1", "file:///shared/models/m1", "s3://models/m1", "gs://b/m", "abfs://c/m"):
        spec = msgspec.convert({"app": "mlr", "init_from": url, "data": {"path": url}}, PSJobSpec)
        ps_job_spec.check_read_locations(spec)
    for field, bad, why in [("init_from", {"init_from": "http://169.254.169.254/latest/meta-data"}, "the scheme http://"),
                            ("data.path", {"data": {"path": "https://internal/admin"}}, "the scheme https://"),
                            ("init_from", {"init_from": "memory://m"}, "the scheme memory://"),
                            ("init_from", {"init_from": "s3://b/m::http://x/m"}, "a chained URL (::)")]:
        with pytest.raises(JobSpecError) as e:
            validate({"app": "mlr", **bad}, untrusted=True)
        assert e.value.field == field and f"the RM does not read {why}" in str(e.value), str(e.value)


def test_a_shape_below_the_minimums_is_refused_unless_it_pauses() -> None:
    spec = validate({"app": "mlr", "workers": 3, "servers": 2, "min_workers": 2, "min_servers": 2})
    assert ps_job_spec.shape_problem(spec, 1, 2) == "workers: 1 is less than this job's min_workers of 2"
    assert ps_job_spec.shape_problem(spec, 2, 1) == "servers: 1 is less than this job's min_servers of 2"
    assert ps_job_spec.shape_problem(spec, 2, 2) is None
    assert ps_job_spec.shape_problem(spec, 1, 1, pause=True) is None   # a paused job holds no executors
