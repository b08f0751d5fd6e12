"""SN-GAN building blocks on one device: shapes, spectral and conditional normalisation, losses,
EMA, and the resumable data stream."""

import os

import numpy as np
import PIL.Image
import pytest
import tensorflow as tf

from vision import data
from vision.sngan import layers as gan_layers
from vision.sngan import learning as sngan_learner
from vision.sngan import networks as sngan


@pytest.mark.parametrize("size", [8, 16, 32])
def test_networks_map_latents_to_images_to_scores(size):
    g = sngan.Generator(num_classes=3, image_size=size, channels=3, base_channels=4, latent_dim=8)
    d = sngan.Discriminator(num_classes=3, image_size=size, base_channels=4)
    labels = tf.constant([0, 1, 2, 1])
    images = g(tf.random.normal([4, 8]), labels, is_training=True)
    assert images.shape == (4, size, size, 3)
    assert float(tf.reduce_max(tf.abs(images))) <= 1.0  # tanh output
    assert d(images, labels, is_training=True).shape == (4,)
    assert len(g.blocks) == len(d.blocks) - 1 == sngan.check_image_size(size)


@pytest.mark.parametrize("size", [4, 12, 20, 100, 512])
def test_unsupported_image_sizes_are_refused_with_advice(size):
    with pytest.raises(ValueError, match="power of two"):
        sngan.check_image_size(size)


def test_widths_follow_biggan():
    assert sngan.generator_multipliers(128) == [16, 16, 8, 4, 2, 1]
    assert sngan.discriminator_multipliers(128) == [1, 2, 4, 8, 16, 16]
    assert sngan.generator_multipliers(16) == [4, 2, 1]


def test_spectral_normalised_weights_have_unit_spectral_norm():
    tf.random.set_seed(0)
    conv = gan_layers.SNConv2D(8, 3)
    linear = gan_layers.SNLinear(5)
    x = tf.random.normal([2, 6, 6, 4])
    for _ in range(30):  # power iterations converge over training calls
        conv(x, is_training=True)
        linear(tf.zeros([2, 7]), is_training=True)
    for layer in (conv, linear):
        w = layer.w.numpy().reshape(-1, layer.w.shape[-1])
        normalised = layer.spectral_norm(layer.w, is_training=False).numpy()
        top = np.linalg.svd(normalised.reshape(w.shape), compute_uv=False)[0]
        assert top == pytest.approx(1.0, abs=1e-3)
    # Not training leaves the power-iteration state alone.
    u = conv.spectral_norm.u.numpy()
    conv(x, is_training=False)
    np.testing.assert_array_equal(u, conv.spectral_norm.u.numpy())


def test_conditional_batch_norm_applies_the_scale_and_offset_of_each_class():
    cbn = gan_layers.ConditionalBatchNorm(num_classes=3)
    x = tf.random.stateless_normal([6, 2, 2, 4], [0, 1]) * 3.0 + 1.0
    labels = tf.constant([0, 1, 2, 0, 1, 2])
    cbn(x, labels, is_training=True)  # create the variables
    gamma = np.arange(12, dtype=np.float32).reshape(3, 4) / 4 + 0.5
    beta = -np.arange(12, dtype=np.float32).reshape(3, 4)
    cbn.gamma.assign(gamma)
    cbn.beta.assign(beta)
    out = cbn(x, labels, is_training=True).numpy()
    mean = x.numpy().mean(axis=(0, 1, 2))
    var = x.numpy().var(axis=(0, 1, 2))
    normalised = (x.numpy() - mean) / np.sqrt(var + 1e-4)
    expected = (
        gamma[labels.numpy()][:, None, None] * normalised + beta[labels.numpy()][:, None, None]
    )
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_projection_discriminator_depends_on_the_class():
    tf.random.set_seed(1)
    d = sngan.Discriminator(num_classes=4, image_size=8, base_channels=4)
    x = tf.random.normal([2, 8, 8, 1])
    a = d(x, tf.constant([0, 0]), is_training=False).numpy()
    b = d(x, tf.constant([3, 3]), is_training=False).numpy()
    assert not np.allclose(a, b)


def test_hinge_losses():
    real = np.array([2.0, 0.5, -1.0], np.float32)
    fake = np.array([-2.0, 0.0, 1.0], np.float32)
    expected_d = np.mean(np.maximum(0, 1 - real)) + np.mean(np.maximum(0, 1 + fake))
    assert float(sngan_learner.discriminator_hinge_loss(real, fake)) == pytest.approx(expected_d)
    assert float(sngan_learner.generator_hinge_loss(fake)) == pytest.approx(-np.mean(fake))


def test_ema_update_averages_floats_and_copies_counters():
    class M(tf.Module):
        def __init__(self, value):
            super().__init__()
            self.w = tf.Variable(value)
            self.count = tf.Variable(3 if value else 0, dtype=tf.int64)

    ema, model = M(0.0), M(10.0)
    sngan_learner.update_ema(ema, model, tf.constant(0.9))
    assert float(ema.w) == pytest.approx(1.0) and int(ema.count) == 3
    sngan_learner.update_ema(ema, model, tf.constant(0.0))
    assert float(ema.w) == pytest.approx(10.0)


def test_config_validation():
    with pytest.raises(ValueError, match="power of two"):
        sngan_learner.SNGANConfig(image_size=24).validate()
    with pytest.raises(ValueError, match="disc_steps"):
        sngan_learner.SNGANConfig(disc_steps=0).validate()


def _gan_batches(dataset, batch, start_step, count, size=8, channels=1):
    input_fn = dataset.input_fn(
        "train", batch, size, seed=3, start_step=start_step, task="gan", channels=channels
    )
    return [b for b, _ in zip(input_fn(tf.distribute.InputContext()), range(count))]


def test_gan_data_stream_can_start_anywhere():
    digits = data.Digits()
    full = _gan_batches(digits, 40, 0, 40)  # into the second epoch of 1437 images
    resumed = _gan_batches(digits, 40, 32, 4)  # a resume after 32 batches
    for (x0, y0), (x1, y1) in zip(full[32:36], resumed):
        np.testing.assert_array_equal(y0.numpy(), y1.numpy())
        np.testing.assert_array_equal(x0.numpy(), x1.numpy())
    labels = np.concatenate([y.numpy() for _, y in full])[:1437]
    assert sorted(labels) == sorted(data.load_digits_arrays()["train"][1])  # a permutation
    images = full[0][0].numpy()
    assert images.shape == (40, 8, 8, 1) and images.min() >= -1.0 and images.max() <= 1.0


def test_gan_digits_batches_do_not_depend_on_the_number_of_pipelines():
    """Two workers (input pipelines) read, together, exactly one worker's global batches."""
    digits = data.Digits()
    one = digits.input_fn("train", 8, 8, seed=1, start_step=5, task="gan", channels=1)
    two = digits.input_fn("train", 8, 8, seed=1, start_step=5, task="gan", channels=1)
    whole = next(iter(one(tf.distribute.InputContext())))
    halves = [
        next(iter(two(tf.distribute.InputContext(2, i, num_replicas_in_sync=2)))) for i in (0, 1)
    ]
    np.testing.assert_array_equal(whole[1].numpy(), np.concatenate([h[1].numpy() for h in halves]))
    np.testing.assert_array_equal(whole[0].numpy(), np.concatenate([h[0].numpy() for h in halves]))


def _write_folder(root, classes, per_class=3, size=10):
    rng = np.random.RandomState(0)
    for name in classes:
        os.makedirs(os.path.join(root, name))
        for i in range(per_class):
            pixels = rng.randint(0, 256, (size, 2 * size, 3), dtype=np.uint8)
            PIL.Image.fromarray(pixels).save(os.path.join(root, name, f"{i}.png"))


@pytest.mark.parametrize("layout", ["train", "flat"])
def test_folder_source(tmp_path, layout):
    root = tmp_path / "train" if layout == "train" else tmp_path  # both folder layouts
    _write_folder(str(root), ["cat", "dog"])
    dataset = data.open_dataset(str(tmp_path))
    assert dataset.classes == ["cat", "dog"] and dataset.num_examples("train") == 6
    images, labels = dataset.arrays("train", 8, task="gan", channels=3)
    assert images.shape == (6, 8, 8, 3) and list(labels) == [0, 0, 0, 1, 1, 1]
    assert images.min() >= -1.0 and images.max() <= 1.0
    # The centre square: the crop of a 10x20 image is its columns 5..14.
    pixels = np.asarray(PIL.Image.open(str(root / "cat" / "0.png")), np.float32)
    expected = tf.image.resize(pixels[:, 5:15], [8, 8], method="area", antialias=True)
    np.testing.assert_allclose(images[0], expected.numpy() / 127.5 - 1.0, atol=1e-4)
    batch = _gan_batches(dataset, 4, 0, 1, channels=3)[0]
    assert batch[0].shape == (4, 8, 8, 3)


def test_gan_training_images_are_flipped_at_random():
    """ImageNet-style data is flipped (about half the time), digits never are."""
    import io

    picture = np.zeros((16, 16, 3), np.uint8)
    picture[:, :4] = 255  # a white band on the left
    buffer = io.BytesIO()
    PIL.Image.fromarray(picture).save(buffer, "PNG")
    encoded = tf.constant(buffer.getvalue())
    lefts = [
        float(data.gan_image(encoded, 8, 3, tf.constant([s, 0], tf.int64))[:, 0].numpy().mean())
        for s in range(40)
    ]
    flipped = sum(left < 0 for left in lefts)
    assert 8 <= flipped <= 32, lefts
    assert float(data.gan_image(encoded, 8, 3, None)[:, 0].numpy().mean()) > 0.9  # no seed


def test_folder_errors(tmp_path):
    with pytest.raises(data.DataError, match="does not exist"):
        data.open_dataset(str(tmp_path / "nowhere"))
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(data.DataError, match="no images"):
        data.open_dataset(str(tmp_path / "empty"))
    _write_folder(str(tmp_path / "bad"), ["a"])
    (tmp_path / "bad" / "a" / "0.png").write_bytes(b"not a png")
    with pytest.raises(data.DataError, match="cannot decode"):
        data.open_dataset(str(tmp_path / "bad"))


def test_standing_statistics_are_the_ema_generators_own_and_change_nothing_after():
    import replication
    from vision.common.normalization import BatchNorm
    from vision.sngan import training

    repl = replication.make("cpu")
    config = sngan_learner.SNGANConfig(
        image_size=8,
        channels=1,
        latent_dim=8,
        g_base_channels=4,
        d_base_channels=4,
        global_batch_size=8,
        disc_steps=1,
        ema_start=0,
        ema_decay=0.5,
        standing_samples=64,
    )
    learner = sngan_learner.SNGANLearner(config, repl)
    iterator = iter(repl.distribute(training.learner_input_fn(data.open_dataset("digits"), config)))
    for _ in range(3):
        learner.train_step(iterator)
    ema = learner.generator_ema
    bn = ema.blocks[0].bn1.batch_norm  # normalises the reshaped output of the first linear layer
    state = [v.numpy() for v in learner._ema_statistics()]  # pylint: disable=protected-access
    assert len(state) == 6 * sum(isinstance(m, BatchNorm) for m in ema.submodules)
    trained_mean = np.ravel(bn.moving_mean.value)

    with learner.standing_statistics(seed=5):
        z = tf.random.stateless_normal([64, 8], tf.constant([5, -1], tf.int64))
        h = tf.reshape(ema.linear(z), [64, 4, 4, -1]).numpy()
        np.testing.assert_allclose(
            np.ravel(bn.moving_mean.value), h.mean(axis=(0, 1, 2)), rtol=1e-4, atol=1e-5
        )
        np.testing.assert_allclose(
            np.ravel(bn.moving_variance.value), h.var(axis=(0, 1, 2)), rtol=1e-4, atol=1e-5
        )
        # Not what training left there (the averaged statistics of other weights).
        assert not np.allclose(np.ravel(bn.moving_mean.value), trained_mean, atol=1e-3)
        inside = learner.sample(np.arange(10), seed=1).numpy()
    # On exit the training state is back, bit for bit.
    for before, variable in zip(state, learner._ema_statistics()):  # pylint: disable=protected-access
        np.testing.assert_array_equal(before, variable.numpy())
    assert not np.allclose(inside, learner.sample(np.arange(10), seed=1).numpy(), atol=1e-4)
