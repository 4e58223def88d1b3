"""Optimus's models (models/optimus_fit.py): the loss-curve fit and the speed functions recover known
parameters from noisy synthetic data; pre-processing; remaining epochs to convergence."""
from __future__ import annotations

import numpy as np
import pytest

from models.optimus_fit import (LossCurve, fit_loss_curve, fit_loss_curves, fit_speed, loss_points, prepare,
                                remove_outliers)


def curve(k: np.ndarray, b0: float, b1: float, b2: float) -> np.ndarray:
    return 1.0 / (b0 * k + b1) + b2


@pytest.mark.parametrize("seed", range(4))
def test_the_loss_fit_recovers_the_coefficients_of_a_noisy_curve_in_raw_units(seed):
    rng = np.random.default_rng(seed)
    k = np.arange(0.0, 40.0)
    # Fig. 7's Seq2Seq coefficients, in a job whose raw loss is 3x the normalised one, 1% noise.
    raw = 3.0 * curve(k, 0.21, 1.07, 0.07) * (1 + rng.normal(0, 0.01, len(k)))
    fit = fit_loss_curve(k, raw)
    assert fit is not None
    b0, b1, b2 = fit.raw()
    assert b0 == pytest.approx(0.21 / 3, rel=0.08)
    assert b1 == pytest.approx(1.07 / 3, rel=0.05)
    assert b2 == pytest.approx(0.07 * 3, rel=0.15)
    assert np.allclose(fit.loss(k), 3.0 * curve(k, 0.21, 1.07, 0.07), rtol=0.02)


def test_an_outlier_is_replaced_before_fitting_and_does_not_bend_the_curve():
    k = np.arange(0.0, 30.0)
    clean = curve(k, 0.3, 1.0, 0.1)
    spiky = clean.copy()
    spiky[12] *= 3.0                                  # e.g. a divergent mini-batch
    fixed = remove_outliers(spiky)
    assert fixed[12] == pytest.approx(0.5 * (clean[11] + clean[13]))
    assert np.array_equal(np.delete(fixed, 12), np.delete(clean, 12))
    fit = fit_loss_curve(k, spiky)
    assert fit is not None and fit.raw()[0] == pytest.approx(0.3, rel=0.05)


def test_preprocessing_normalises_by_the_largest_loss_and_averages_long_histories():
    k = np.arange(100.0)
    ks, ls, scale = prepare(k, 5.0 * curve(k, 0.1, 1.0, 0.0), max_points=10)
    assert scale == pytest.approx(5.0) and ls.max() <= 1.0
    assert len(ks) == 10 and ks[0] == pytest.approx(4.5) and ls[0] == pytest.approx(
        np.mean(curve(np.arange(10.0), 0.1, 1.0, 0.0)))


def test_too_few_points_or_non_positive_losses_give_no_curve():
    k = np.arange(3.0)
    assert fit_loss_curve(k, curve(k, 0.2, 1.0, 0.1)) is None
    k = np.arange(10.0)
    fits = fit_loss_curves([(k, curve(k, 0.2, 1.0, 0.1)), (k, curve(k, 0.2, 1.0, -0.5)), (k[:2], k[:2] + 1)])
    assert fits[0] is not None and fits[1] is None and fits[2] is None


def test_loss_points_put_the_initial_objective_at_zero_epochs_and_epoch_e_at_e_plus_one():
    ks, ls = loss_points(2.0, [(0, 1.5), (1, 1.2), (2, float("nan")), (3, 1.0)])
    assert ks.tolist() == [0.0, 1.0, 2.0, 4.0] and ls.tolist() == [2.0, 1.5, 1.2, 1.0]


@pytest.mark.parametrize("b0,b1,b2,delta", [(0.21, 1.07, 0.07, 0.01), (0.5, 1.0, 0.0, 0.0011), (0.05, 2.0, 0.3, 0.02)])
def test_epochs_to_converge_is_the_first_epoch_improving_less_than_the_threshold(b0, b1, b2, delta):
    c = LossCurve(b0, b1, b2)
    brute = next(k for k in range(1, 1_000_000)
                 if (c.loss(k - 1) - c.loss(k)) / c.loss(k - 1) < delta)
    assert c.epochs_to_converge(delta) == brute
    assert c.remaining_epochs(10, delta) == max(0, brute - 10)
    assert LossCurve(0.0, 1.0, 0.5).epochs_to_converge(delta) == 0.0     # a flat curve has converged


def sync_speed(p, w, th=(2.0, 0.5, 0.3, 0.02, 0.05)):
    return 1.0 / (th[0] / w + th[1] + th[2] * w / p + th[3] * w + th[4] * p)


def async_speed(p, w, th=(1.5, 0.8, 0.1, 0.05)):
    return w / (th[0] + th[1] * w / p + th[2] * w + th[3] * p)


@pytest.mark.parametrize("sync,truth,theta", [(True, sync_speed, (2.0, 0.5, 0.3, 0.02, 0.05)),
                                              (False, async_speed, (1.5, 0.8, 0.1, 0.05))])
def test_the_speed_fit_recovers_eq3_and_eq4_from_noisy_samples(sync, truth, theta):
    rng = np.random.default_rng(7)
    samples = [(p, w, truth(p, w) * (1 + rng.normal(0, 0.01))) for p in range(1, 9) for w in range(1, 9)]
    fit = fit_speed(samples, sync, prior_weight=0.0)      # the paper's plain NNLS fit
    assert fit is not None
    assert np.allclose(fit.theta(), theta, rtol=0.1, atol=0.01)
    # With the reference pseudo-samples the predictions stay close where the samples are.
    seeded = fit_speed(samples, sync, max_servers=8, max_workers=8)
    assert seeded is not None
    for p, w in [(1, 1), (2, 6), (8, 8)]:
        assert float(seeded.speed(p, w)) == pytest.approx(truth(p, w), rel=0.05)


def test_samples_at_one_shape_give_the_reference_scaled_to_them_and_a_second_shape_corrects_it():
    one = fit_speed([(2, 4, sync_speed(2, 4))] * 3, True, 8, 8)
    assert one is not None and float(one.speed(2, 4)) == pytest.approx(sync_speed(2, 4))
    more = fit_speed([(p, w, sync_speed(p, w)) for p, w in [(2, 4), (2, 8), (4, 8), (1, 2)]], True, 8, 8)
    assert more is not None
    err_one = abs(float(one.speed(4, 8)) - sync_speed(4, 8))
    err_more = abs(float(more.speed(4, 8)) - sync_speed(4, 8))
    assert err_more < err_one and err_more / sync_speed(4, 8) < 0.05
    assert fit_speed([], True) is None and fit_speed([(1, 1, 0.0)], True) is None
