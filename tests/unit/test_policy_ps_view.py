"""The typed PS job view policies read (AppView.ps, rm/policies/snapshot.py), built with the snapshot."""
from __future__ import annotations

import msgspec

from protocol.ps_app_schemas import APP_SCHEMAS
from protocol.records import AppState, NodeState, Resource
from rm.model import AmSpec
from rm.policies import AppView, NodeView, ps_job_view
from rm.policy_runner import build_snapshot
from rm_testing import make_core, ps_spec, register, submit


def submit_ps(core, spec: dict) -> str:
    app_id = core.new_application()
    core.submit(app_id, "alice", "ps", "default", "ELASTANE_PS", AmSpec(["true"], {}, {}, Resource(512, 1)), 1,
                ps_job=ps_spec(spec))
    core.app_saved(app_id)
    return app_id


def test_snapshot_carries_the_ps_spec_typed_with_the_executor_as_the_scheduler_grants_it() -> None:
    core = make_core(minimum_allocation_mb=256)
    register(core, "n1:1")
    ps = submit_ps(core, {"app": "mlr", "workers": 3, "servers": 2, "min_workers": 2, "max_workers": 6,
                          "executor_memory_mb": 300, "executor_vcores": 2, "max_epochs": 7, "weight": 2.0,
                          "sync": "ssp"})
    other = submit(core)
    views = {v.app_id: v for v in build_snapshot(core).apps}
    view = views[ps].ps
    assert view is not None and views[other].ps is None
    assert (view.app, view.workers, view.servers, view.min_workers, view.max_workers) == ("mlr", 3, 2, 2, 6)
    assert (view.min_servers, view.max_servers) == (1, 2)          # defaults: one server, the submitted count
    assert view.executor == Resource(512, 2)                      # 300 MB rounded up to the 256 MB step
    assert (view.max_epochs, view.weight, view.bsp) == (7, 2.0, False)
    assert (view.n_min, view.n_max) == (3, 8)
    assert views[ps].state is AppState.ACCEPTED and not views[ps].started
    assert build_snapshot(core).nodes[0].state is NodeState.RUNNING


def test_effective_epochs_and_threshold_are_the_spec_over_hparams_over_the_app_defaults() -> None:
    by_hparams = ps_job_view({"app": "lda", "hparams": {"max_epochs": 9, "convergence_threshold": 0.5}})
    by_spec = ps_job_view({"app": "lda", "hparams": {"max_epochs": 9}, "max_epochs": 4})
    default = ps_job_view({"app": "lda"})
    assert by_hparams is not None and (by_hparams.max_epochs, by_hparams.convergence_threshold) == (9, 0.5)
    assert by_spec is not None and by_spec.max_epochs == 4
    schema_default = {f.name: f.default for f in msgspec.structs.fields(APP_SCHEMAS["lda"].hparams)}["max_epochs"]
    assert default is not None
    assert default.max_epochs == APP_SCHEMAS["lda"].preset_hparams["tiny"].get("max_epochs", schema_default)


def test_a_user_app_has_only_the_epochs_its_hparams_state() -> None:
    bare = ps_job_view({"app": "mymod:MyApp"})
    told = ps_job_view({"app": "mymod:MyApp", "hparams": {"max_epochs": 12}})
    assert bare is not None and bare.max_epochs is None and bare.convergence_threshold is None
    assert told is not None and told.max_epochs == 12


def test_not_a_spec_is_no_view() -> None:
    assert ps_job_view({"other": 1}) is None
    assert ps_job_view({"app": "mlr", "workers": "many"}) is None


def test_the_snapshot_takes_the_view_the_app_keeps_it_is_not_rebuilt_each_round() -> None:
    core = make_core(minimum_allocation_mb=256)
    register(core, "n1:1")
    ps = submit_ps(core, {"app": "mlr", "executor_memory_mb": 300})
    kept = core.apps[ps].ps
    assert kept is not None and kept.executor == Resource(512, 1)
    first, second = (next(v.ps for v in build_snapshot(core).apps if v.app_id == ps) for _ in range(2))
    assert first is kept and second is kept


def test_views_built_outside_the_rm_take_state_names() -> None:
    app = AppView("a", "default", "u", "RUNNING", 0.0, Resource(0, 0))   # type: ignore[arg-type]
    node = NodeView("n", "/r", "LOST", Resource(1, 1), Resource(0, 0))   # type: ignore[arg-type]
    assert app.state is AppState.RUNNING and node.state is NodeState.LOST
