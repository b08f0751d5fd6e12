"""GAN metrics from a classifier the user supplies: Inception Score and Frechet distance (FID).

Nothing is downloaded. The classifier is a SavedModel directory (see `save_classifier`) with

- `classify(images)`: `images` float32 `[N, H, W, C]` in [-1, 1] -> `{"features": [N, F],
  "logits": [N, K]}`; features are the penultimate layer (FID), logits the class scores (IS);
- `image_size`, `channels`: the `H`(=`W`) and `C` it expects. Images of another size are resized
  (bilinear), grey images are tiled to RGB and RGB images averaged to grey as needed.

`vision/metrics/digits_classifier.py` trains and saves one for the digits data; for ImageNet wrap your
own network (e.g. an Inception-v3 you have weights for) with `save_classifier`.

Definitions, with p(y|x) = softmax(logits) and p(y) its mean over the samples of a split:

    IS  = exp(E_x[KL(p(y|x) || p(y))])                       1 <= IS <= K
          reported as the mean (and std) over 10 equal splits of the samples, as in
          Salimans et al. 2016 and the papers that compare with it (50,000 samples there)
    FID = |mu_1 - mu_2|^2 + tr(S_1 + S_2 - 2 (S_1 S_2)^(1/2))   for features ~ (mu_i, S_i)
"""

import warnings
from collections.abc import Callable

import numpy as np
import scipy.linalg
import scipy.special
import tensorflow as tf


class ClassifierExportError(ValueError):
    """A classifier directory that is missing or does not follow the contract above."""


def save_classifier(
    path: str,
    fn: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]],
    image_size: int,
    channels: int,
    module: tf.Module = None,
) -> None:
    """Saves `fn(images) -> (features, logits)` as a classifier directory the metrics can load.

    Args:
        path: output directory.
        fn: maps float32 images `[N, image_size, image_size, channels]` in [-1, 1] to penultimate
            features `[N, F]` and logits `[N, K]`.
        image_size, channels: the input `fn` expects.
        module: the tf.Module owning `fn`'s variables (so they are saved with it).
    """
    root = tf.Module()
    root.network = module
    root.image_size = tf.Variable(image_size, trainable=False, dtype=tf.int32)
    root.channels = tf.Variable(channels, trainable=False, dtype=tf.int32)

    @tf.function(
        input_signature=[tf.TensorSpec([None, image_size, image_size, channels], tf.float32)]
    )
    def classify(images):
        features, logits = fn(images)
        return {"features": features, "logits": logits}

    root.classify = classify
    tf.saved_model.save(root, path)


class Classifier:
    """A loaded classifier directory: `classifier(images) -> (features, logits)` as numpy."""

    def __init__(self, path: str):
        try:
            self._model = tf.saved_model.load(path)
        except (OSError, ValueError) as e:
            raise ClassifierExportError(
                f"cannot load a classifier from {path!r} ({e.__class__.__name__}: {e}). Pass a "
                "directory written by vision.metrics.gan.save_classifier, e.g. by "
                "`python -m vision.metrics.digits_classifier --out DIR`."
            ) from e
        for attr in ("classify", "image_size", "channels"):
            if not hasattr(self._model, attr):
                raise ClassifierExportError(
                    f"{path!r} is a SavedModel but has no `{attr}`; save it with "
                    "vision.metrics.gan.save_classifier."
                )
        self.image_size = int(self._model.image_size.numpy())
        self.channels = int(self._model.channels.numpy())

    def _prepare(self, images: tf.Tensor) -> tf.Tensor:
        images = tf.convert_to_tensor(images, tf.float32)
        if images.shape[1] != self.image_size or images.shape[2] != self.image_size:
            images = tf.image.resize(images, [self.image_size, self.image_size], "bilinear")
        c = images.shape[-1]
        if c != self.channels:
            if c == 1:
                images = tf.tile(images, [1, 1, 1, self.channels])
            elif self.channels == 1:
                images = tf.reduce_mean(images, axis=-1, keepdims=True)
            else:
                raise ValueError(
                    f"cannot feed {c}-channel images to a {self.channels}-channel classifier"
                )
        return images

    def __call__(self, images, batch_size: int = 500) -> tuple[np.ndarray, np.ndarray]:
        """Features and logits of `images` `[N, H, W, C]` in [-1, 1], in batches."""
        features, logits = [], []
        for start in range(0, len(images), batch_size):
            out = self._model.classify(self._prepare(images[start : start + batch_size]))
            features.append(out["features"].numpy())
            logits.append(out["logits"].numpy())
        return np.concatenate(features), np.concatenate(logits)


# Papers report IS as the mean over 10 splits of 50,000 samples (Salimans et al. 2016).
IS_SPLITS = 10
PAPER_SAMPLES = 50_000
# FID's matrix square root may have an imaginary part from rounding; more than this (on
# the diagonal) means the covariances are not valid (e.g. not positive semi-definite).
MAX_IMAGINARY = 1e-3


def inception_score(logits: np.ndarray, splits: int = IS_SPLITS) -> tuple[float, float]:
    """Inception Score of the samples whose class logits are `logits` `[N, K]`.

    Returns:
        (mean, std) of the score over `splits` equal parts of the samples.
    """
    logits = np.asarray(logits, np.float64)
    if not 1 <= splits <= len(logits):
        raise ValueError(f"Inception Score over {splits} splits needs at least {splits} samples.")
    log_p = logits - scipy.special.logsumexp(logits, axis=1, keepdims=True)
    scores = []
    for part in np.array_split(log_p, splits):
        log_py = scipy.special.logsumexp(part, axis=0) - np.log(len(part))
        kl = np.sum(np.exp(part) * (part - log_py), axis=1)
        scores.append(float(np.exp(np.mean(kl))))
    return float(np.mean(scores)), float(np.std(scores))


def gaussian_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean `[F]` and covariance `[F, F]` (unbiased) of `features` `[N, F]`."""
    features = np.asarray(features, np.float64)
    return features.mean(axis=0), np.cov(features, rowvar=False)


def frechet_distance(
    mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray
) -> float:
    """Frechet distance between N(mu1, sigma1) and N(mu2, sigma2)."""
    mu1, mu2 = np.atleast_1d(mu1).astype(np.float64), np.atleast_1d(mu2).astype(np.float64)
    sigma1 = np.atleast_2d(sigma1).astype(np.float64)
    sigma2 = np.atleast_2d(sigma2).astype(np.float64)
    covmean = _sqrtm(sigma1 @ sigma2)
    if not np.all(np.isfinite(covmean)):
        # Singular product (fewer samples than features): regularise, as is customary.
        offset = np.eye(len(mu1)) * 1e-6
        covmean = _sqrtm((sigma1 + offset) @ (sigma2 + offset))
    if np.iscomplexobj(covmean):
        imaginary = float(np.max(np.abs(np.diagonal(covmean).imag)))
        if imaginary > MAX_IMAGINARY:
            raise ValueError(
                f"FID: the square root of sigma1 @ sigma2 has an imaginary part of {imaginary:.3g} "
                "on its diagonal: the covariances are not valid (positive semi-definite) "
                "covariances. Compute them with gaussian_statistics from real features."
            )
        covmean = covmean.real  # imaginary parts this small are rounding noise
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2.0 * np.trace(covmean))


def _sqrtm(matrix: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():  # singular products are handled by the caller
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        return scipy.linalg.sqrtm(matrix)


def fid_from_features(features1: np.ndarray, features2: np.ndarray) -> float:
    """FID between two sets of classifier features `[N1, F]`, `[N2, F]`."""
    return frechet_distance(*gaussian_statistics(features1), *gaussian_statistics(features2))


def scores(
    features: np.ndarray,
    logits: np.ndarray,
    labels: np.ndarray | None = None,
    reference_statistics: tuple[np.ndarray, np.ndarray] | None = None,
    splits: int = IS_SPLITS,
) -> dict[str, float]:
    """Metrics of generated images from their classifier `features` and `logits`.

    Returns:
        "inception_score" (mean over `splits` splits) and "inception_score_std"; "fid" against
        `reference_statistics` = (mu, sigma) of real features, if given; "class_accuracy", the
        fraction the classifier labels as their conditioning class `labels`, if given.
    """
    score, spread = inception_score(logits, splits)
    results = {"inception_score": score, "inception_score_std": spread}
    if reference_statistics is not None:
        results["fid"] = frechet_distance(*gaussian_statistics(features), *reference_statistics)
    if labels is not None:
        results["class_accuracy"] = float(np.mean(np.argmax(logits, 1) == np.asarray(labels)))
    return results


def evaluate(
    classifier: Classifier,
    images: np.ndarray,
    labels: np.ndarray | None = None,
    reference_statistics: tuple[np.ndarray, np.ndarray] | None = None,
    splits: int = IS_SPLITS,
) -> dict[str, float]:
    """`scores` of generated `images` (all in memory; see `scores` for large sets)."""
    features, logits = classifier(images)
    return scores(features, logits, labels, reference_statistics, splits)
