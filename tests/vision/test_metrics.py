"""Inception Score and FID against direct numpy/scipy computations and known closed forms."""

import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf

from vision.metrics import gan as gan_metrics


def _random_spd(rng, dim):
    a = rng.randn(dim, dim)
    return a @ a.T / dim + 0.1 * np.eye(dim)


def _closed_form_fid(mu1, s1, mu2, s2):
    """|mu1 - mu2|^2 + tr(S1 + S2 - 2 (S1^1/2 S2 S1^1/2)^1/2), by eigendecompositions only."""
    w, v = np.linalg.eigh(s1)
    root1 = v @ np.diag(np.sqrt(w)) @ v.T
    inner = np.linalg.eigvalsh(root1 @ s2 @ root1)
    return float(
        np.sum((mu1 - mu2) ** 2)
        + np.trace(s1)
        + np.trace(s2)
        - 2 * np.sum(np.sqrt(np.clip(inner, 0, None)))
    )


def test_frechet_distance_matches_the_closed_form_for_gaussians():
    rng = np.random.RandomState(0)
    dim = 6
    mu1, mu2 = rng.randn(dim), rng.randn(dim)
    s1, s2 = _random_spd(rng, dim), _random_spd(rng, dim)  # non-commuting covariances
    expected = _closed_form_fid(mu1, s1, mu2, s2)
    assert gan_metrics.frechet_distance(mu1, s1, mu2, s2) == pytest.approx(expected, rel=1e-8)
    assert gan_metrics.frechet_distance(mu1, s1, mu1, s1) == pytest.approx(0.0, abs=1e-8)
    # Diagonal covariances: |mu1 - mu2|^2 + sum (sigma1 - sigma2)^2.
    d1, d2 = rng.uniform(0.5, 2, dim), rng.uniform(0.5, 2, dim)
    diagonal = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(d1) - np.sqrt(d2)) ** 2)
    assert gan_metrics.frechet_distance(mu1, np.diag(d1), mu2, np.diag(d2)) == pytest.approx(
        diagonal, rel=1e-8
    )


def test_fid_from_samples():
    rng = np.random.RandomState(1)
    dim, n = 4, 40_000
    mu1, mu2 = np.zeros(dim), np.full(dim, 0.5)
    s1, s2 = _random_spd(rng, dim), _random_spd(rng, dim)
    x1 = rng.multivariate_normal(mu1, s1, size=n)
    x2 = rng.multivariate_normal(mu2, s2, size=n)
    # A set against itself is 0; its statistics are numpy's mean and unbiased covariance.
    assert gan_metrics.fid_from_features(x1, x1) == pytest.approx(0.0, abs=1e-6)
    mu, sigma = gan_metrics.gaussian_statistics(x1)
    np.testing.assert_allclose(mu, x1.mean(0))
    np.testing.assert_allclose(sigma, np.cov(x1.T))
    # Samples of two Gaussians converge to the closed form, and to scipy's sqrtm directly.
    expected = _closed_form_fid(mu1, s1, mu2, s2)
    assert gan_metrics.fid_from_features(x1, x2) == pytest.approx(expected, rel=0.05)
    m1, c1 = x1.mean(0), np.cov(x1.T)
    m2, c2 = x2.mean(0), np.cov(x2.T)
    direct = (
        np.sum((m1 - m2) ** 2)
        + np.trace(c1 + c2)
        - 2 * np.trace(np.real(scipy.linalg.sqrtm(c1 @ c2)))
    )
    assert gan_metrics.fid_from_features(x1, x2) == pytest.approx(direct, rel=1e-8)


def test_fid_with_fewer_samples_than_features_is_finite():
    rng = np.random.RandomState(2)
    x1, x2 = rng.randn(10, 32), rng.randn(10, 32) + 1.0
    fid = gan_metrics.fid_from_features(x1, x2)
    assert np.isfinite(fid) and fid > 0


def _numpy_inception_score(logits):
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    py = p.mean(0)
    return np.exp(np.mean(np.sum(p * (np.log(p) - np.log(py)), axis=1)))


def test_inception_score_matches_numpy_and_is_bounded():
    rng = np.random.RandomState(3)
    k = 10
    for scale in (0.1, 1.0, 5.0):
        logits = scale * rng.randn(500, k)
        score, std = gan_metrics.inception_score(logits, splits=1)
        assert score == pytest.approx(_numpy_inception_score(logits), rel=1e-9)
        assert 1.0 <= score <= k and std == 0.0


def test_inception_score_extremes():
    k = 10
    confident = 100.0 * np.eye(k)[np.arange(1000) % k]  # sure of each class, classes uniform
    assert gan_metrics.inception_score(confident, splits=1)[0] == pytest.approx(k, rel=1e-6)
    one_class = 100.0 * np.eye(k)[np.zeros(1000, int)]  # sure, but always the same class
    assert gan_metrics.inception_score(one_class, splits=1)[0] == pytest.approx(1.0, rel=1e-6)
    unsure = np.zeros((1000, k))  # uniform predictions
    assert gan_metrics.inception_score(unsure, splits=1)[0] == pytest.approx(1.0, rel=1e-9)
    mean, std = gan_metrics.inception_score(confident, splits=10)
    assert mean == pytest.approx(k, rel=1e-6) and std == pytest.approx(0.0, abs=1e-6)


class _Linear(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.random.stateless_normal([4 * 4 * 3, 5], [0, 1]))

    def __call__(self, images):
        features = tf.reshape(images, [-1, 4 * 4 * 3])
        return features, features @ self.w


def test_saved_classifier_round_trip(tmp_path):
    net = _Linear()
    path = str(tmp_path / "classifier")
    gan_metrics.save_classifier(path, net, image_size=4, channels=3, module=net)
    classifier = gan_metrics.Classifier(path)
    assert (classifier.image_size, classifier.channels) == (4, 3)
    images = np.random.RandomState(0).uniform(-1, 1, (7, 4, 4, 3)).astype(np.float32)
    features, logits = classifier(images, batch_size=3)
    expected_features, expected_logits = net(images)
    np.testing.assert_allclose(features, expected_features.numpy(), rtol=1e-6)
    np.testing.assert_allclose(logits, expected_logits.numpy(), rtol=1e-5, atol=1e-6)
    # Other sizes are resized and grey images tiled to the classifier's input.
    features, _ = classifier(np.zeros((2, 8, 8, 1), np.float32))
    assert features.shape == (2, 48)
    results = gan_metrics.evaluate(
        classifier,
        images,
        labels=np.argmax(expected_logits, 1),
        reference_statistics=gan_metrics.gaussian_statistics(expected_features.numpy()),
        splits=1,
    )
    assert results["class_accuracy"] == 1.0
    assert results["fid"] == pytest.approx(0.0, abs=1e-3)
    assert 1.0 <= results["inception_score"] <= 5.0


def test_classifier_errors_say_what_to_pass(tmp_path):
    with pytest.raises(gan_metrics.ClassifierExportError, match="save_classifier"):
        gan_metrics.Classifier(str(tmp_path / "missing"))
    module = tf.Module()
    module.v = tf.Variable(1.0)
    tf.saved_model.save(module, str(tmp_path / "other"))
    with pytest.raises(gan_metrics.ClassifierExportError, match="classify"):
        gan_metrics.Classifier(str(tmp_path / "other"))


def test_inception_score_by_hand():
    # Two samples, two classes: p(y|x) = (0.9, 0.1) and (0.1, 0.9), so p(y) = (0.5, 0.5) and
    # KL = 0.9 ln(0.9 / 0.5) + 0.1 ln(0.1 / 0.5) = 0.368064... for each: IS = e^0.368064.
    logits = np.log([[0.9, 0.1], [0.1, 0.9]])
    by_hand = np.exp(0.9 * np.log(1.8) + 0.1 * np.log(0.2))
    assert by_hand == pytest.approx(1.444935, abs=1e-6)
    assert gan_metrics.inception_score(logits, splits=1)[0] == pytest.approx(by_hand, rel=1e-9)
    # With splits of one confident sample each, p(y) = p(y|x): every split scores exactly 1.
    assert gan_metrics.inception_score(logits, splits=2) == pytest.approx((1.0, 0.0))
    # Splits of unequal scores: the mean and the (population) std over splits.
    four = np.log([[0.9, 0.1], [0.1, 0.9], [0.5, 0.5], [0.5, 0.5]])
    mean, std = gan_metrics.inception_score(four, splits=2)
    assert (mean, std) == pytest.approx(((by_hand + 1.0) / 2, (by_hand - 1.0) / 2))
    assert gan_metrics.IS_SPLITS == 10  # the papers' default
    with pytest.raises(ValueError, match="at least 10 samples"):
        gan_metrics.inception_score(logits)


def test_fid_rejects_a_square_root_with_a_significant_imaginary_part():
    mu = np.zeros(2)
    # Not a covariance (a negative variance): sqrtm(S1 S2) = diag(i, 1).
    with pytest.raises(ValueError, match="imaginary part of 1"):
        gan_metrics.frechet_distance(mu, np.eye(2), mu, np.diag([-1.0, 1.0]))
    # Rounding-sized imaginary parts of valid covariances are accepted (and dropped).
    rng = np.random.RandomState(4)
    s1, s2 = _random_spd(rng, 8), _random_spd(rng, 8)
    assert np.isfinite(gan_metrics.frechet_distance(np.zeros(8), s1, np.ones(8), s2))
