"""Optimus's models (models/optimus_fit.py): the loss-curve fit and the speed functions recover known
parameters from noisy synthetic data; pre-processing; remaining epochs to convergence."""
from __future__ import annotations

import numpy as np
import pytest

from models.optimus_fit import (SYNC_FEATURES, LossCurve, SpeedFunction, app_prior, fit_loss_curve, fit_loss_curves,
                                fit_shape, fit_speed, fittable, inverse_speed, loss_points, normalised, orientation,
                                prepare, remove_outliers)


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


def test_too_few_points_or_non_finite_losses_give_no_curve():
    k = np.arange(3.0)
    assert fit_loss_curve(k, curve(k, 0.2, 1.0, 0.1)) is None
    k = np.arange(10.0)
    bad = curve(k, 0.2, 1.0, 0.1)
    bad[4] = np.inf
    fits = fit_loss_curves([(k, curve(k, 0.2, 1.0, 0.1)), (k, bad), (k[:2], k[:2] + 1)])
    assert fits[0] is not None and fits[1] is None and fits[2] is None
    # Four points within a tenth of an epoch span too little to say anything.
    assert not fittable([0.0, 0.03, 0.06, 0.09]) and fit_loss_curve(np.array([0.0, 0.03, 0.06, 0.09]),
                                                                     curve(np.array([0.0, 0.03, 0.06, 0.09]), 0.2, 1, 0)) is None


def raw_converge(objective, delta: float) -> int:
    """The runtime's test (psruntime/apps/base.py) on a raw objective series k -> x(k)."""
    return next(k for k in range(2, 1_000_000)
                if abs(objective(k) - objective(k - 1)) / max(abs(objective(k - 1)), 1e-12) < delta)


def test_a_rising_negative_objective_like_ldas_log_likelihood_is_fitted_in_its_own_units():
    # LDA reports a log-likelihood: negative, rising as it learns. Fitted on -x (sign -1, no offset).
    k = np.arange(0.0, 12.0)
    x = -7.0 * curve(k, 0.3, 1.2, 0.5)
    assert orientation(x) == (-1.0, 0.0)
    fit = fit_loss_curve(k, x)
    assert fit is not None and fit.sign == -1.0
    assert np.allclose(fit.loss(k), x, rtol=0.01)
    assert fit.epochs_to_converge(0.005) == raw_converge(lambda j: -7.0 * float(curve(np.array(j), 0.3, 1.2, 0.5)), 0.005)


def test_an_objective_crossing_zero_is_fitted_with_an_offset_and_converges_on_the_raw_test():
    k = np.arange(0.0, 15.0)
    x = curve(k, 0.25, 1.0, 0.0) - 0.3          # 0.7 falling below zero
    sign, offset = orientation(x)
    assert sign == 1.0 and offset > 0 and (x + offset).min() > 0
    fit = fit_loss_curve(k, x)
    assert fit is not None and fit.offset == offset
    assert np.allclose(fit.loss(k), x, atol=0.01)
    # The relative test on x itself (|x| falls through 0, then grows again to 0.3)
    truth = raw_converge(lambda j: float(curve(np.array(j), 0.25, 1.0, 0.0)) - 0.3, 0.01)
    assert abs(fit.epochs_to_converge(0.01) - truth) <= 1


def test_a_two_epoch_job_is_fitted_from_per_clock_points():
    # Epoch points alone (initial + 2 epochs) are too few; the objective every 1/8 epoch is enough,
    # and predicts the convergence epoch of the whole curve.
    truth = (0.4, 1.5, 0.2)
    clock = [(j / 8.0, float(curve(np.array(j / 8.0), *truth))) for j in range(1, 16)]
    epochs = [(0, float(curve(np.array(1.0), *truth))), (1, float(curve(np.array(2.0), *truth)))]
    initial = float(curve(np.array(0.0), *truth))
    assert fit_loss_curve(*loss_points(initial, epochs)) is None
    ks, ls = loss_points(initial, epochs, clock)
    assert ks[0] == 0.0 and 2.0 in ks.tolist() and 0.125 in ks.tolist() and len(ks) == 17
    fit = fit_loss_curve(ks, ls)
    assert fit is not None
    assert fit.epochs_to_converge(0.01) == pytest.approx(LossCurve(*truth).epochs_to_converge(0.01), abs=1)


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


@pytest.mark.parametrize("app", ["nmf", "lasso"])
def test_the_nmf_and_lasso_priors_say_extra_servers_slow_the_job_where_the_reference_says_they_help(app):
    prior = app_prior(app, True)
    assert prior is not None
    for w in (1, 2, 4):
        assert float(prior.speed(2, w)) < float(prior.speed(1, w))
    # Seeded with the app's prior, a job measured at one shape is predicted slower with more servers.
    measured = [(1, 2, 0.5)] * 3
    fit = fit_speed(measured, True, 8, 8, prior=prior)
    assert fit is not None and float(fit.speed(1, 2)) == pytest.approx(0.5)
    assert float(fit.speed(4, 2)) < 0.5
    ref = fit_speed(measured, True, 8, 8)            # the paper's ResNet-50 reference: servers help
    assert ref is not None and float(ref.speed(4, 2)) > 0.5
    assert app_prior("no-such-app", True) is None


# ----- a shape shared by several jobs --------------------------------------------------------------

def _paper_sync_truth() -> SpeedFunction:
    """Optimus Table 2's synchronous speed function as printed (M = 1): another worker at the same
    servers slows the job (its w/p term); the reference prior (M = 16) says it hardly matters."""
    coef = [0.0] * 7
    for i, v in zip(SYNC_FEATURES, (1.02, 2.78, 4.92, 0.0, 0.02)):
        coef[i] = v
    return SpeedFunction(tuple(coef), True)


def test_jobs_sampled_in_different_directions_together_give_the_shape_their_own_fits_miss():
    # Three jobs of one app at different data sizes (scales 1, 3 and 0.5), each sampled at two
    # shapes only, each pair differing in another direction (more workers; more servers; both).
    # Fitted on all their samples at once, the shape is the truth's; the mean of their own
    # (normalised) fits keeps the reference's view that another worker costs little.
    truth = _paper_sync_truth()
    rays = {1.0: [(2, 2), (2, 4)], 3.0: [(4, 4), (8, 4)], 0.5: [(4, 2), (8, 8)]}
    jobs = [[(p, w, 1.0 / (scale * inverse_speed(truth.coefficients, p, w))) for p, w in shapes for _ in range(3)]
            for scale, shapes in rays.items()]
    shared = fit_shape(jobs, True)
    assert shared is not None
    fits = [normalised(f) for f in (fit_speed(j, True) for j in jobs) if f is not None]
    mean = [sum(f.coefficients[i] for f in fits) / len(fits) for i in range(7)]
    want = normalised(truth).coefficients

    def slowdown(coef, p: int, w: int) -> float:          # one more worker at (p, w)
        return inverse_speed(coef, p, w + 1) / inverse_speed(coef, p, w)
    for p, w in [(2, 2), (4, 2), (8, 8), (16, 4)]:
        assert slowdown(shared.coefficients, p, w) == pytest.approx(slowdown(want, p, w), rel=0.01), (p, w)
    assert max(abs(slowdown(mean, p, w) / slowdown(want, p, w) - 1) for p, w in [(2, 2), (4, 2), (8, 8)]) > 0.05


def test_a_shape_needs_a_usable_sample():
    assert fit_shape([], True) is None
    assert fit_shape([[(0, 2, 1.0), (2, 2, float("nan"))]], True) is None
