"""A default run at preset `tiny` generalizes (issue 15): with the preset's own sizes and
hyper-parameters, no overrides, each app gets close to its generator's true model on held-out
data -- MLR's accuracy within 5 points of the true weights', NMF's and Lasso's RMSE within 10 % of
the noise floor, LDA's perplexity within 10 % of the true topics'. Trained in process with the PS
workers' math, single process and split over 2 BSP workers like the default job (2 workers);
`small` and `medium` are measured by bench/training.py."""
from __future__ import annotations

import pytest

from protocol.ps_job_spec import validate
from psruntime.apps.quality import check_quality
from psruntime.apps.registry import APP_NAMES, create_app
from psruntime.apps.single_process import train_single_process
from test_apps_learning import DictServers, run_bsp


@pytest.mark.parametrize("name", APP_NAMES)
def test_default_tiny_run_reaches_the_heldout_target(name: str) -> None:
    app = create_app(name, preset="tiny")
    result, _ = train_single_process(app)       # to convergence or the preset's epoch limit
    quality = check_quality(name, result.metrics)
    assert quality is not None and quality.met, (quality, result.metrics, len(result.epochs))


@pytest.mark.parametrize("name", APP_NAMES)
def test_default_tiny_job_over_two_bsp_workers_reaches_the_heldout_target(name: str) -> None:
    # what the AM builds for a default job: the preset's data and hyper-parameters via the spec
    spec = validate({"app": name})
    app = create_app(name, spec.app_data(), spec.app_hparams())
    servers = DictServers(app)
    run_bsp(app, int(app.hparams.max_epochs), num_workers=spec.workers, servers=servers)
    metrics = app.evaluate(servers.model(app), app.generate_heldout())
    quality = check_quality(name, metrics)
    assert quality is not None and quality.met, (quality, metrics)
