"""ImageNet on-disk forms, digits and the resumable per-pipeline input streams."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
import tensorflow as tf

from vision import data

pytestmark = pytest.mark.timeout(300)

NUM_CLASSES, PER_CLASS, EVAL_PER_CLASS = 3, 8, 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, str]:
    """Both forms, written from the same seed: identical JPEGs, different containers."""
    roots = {}
    for form in data.tiny.FORMS:
        root = str(tmp_path_factory.mktemp(form))
        data.write_tiny_imagenet(
            root,
            form=form,
            num_classes=NUM_CLASSES,
            images_per_class=PER_CLASS,
            eval_images_per_class=EVAL_PER_CLASS,
            size=24,
            num_shards=4,
        )
        roots[form] = root
    return roots


def _context(pipelines: int, index: int) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(pipelines, index, num_replicas_in_sync=pipelines)


def _eval_pass(dataset, pipelines=1, index=0, batch=4, image_size=16):
    """All real (mask 1) examples of one pipeline's evaluation pass."""
    input_fn = dataset.input_fn("eval", batch * pipelines, image_size)
    images, labels = [], []
    for x, y, mask in input_fn(_context(pipelines, index)):
        mask = mask.numpy() > 0
        if not mask.any():
            break
        images.extend(x.numpy()[mask])
        labels.extend(y.numpy()[mask])
    return np.array(images), np.array(labels)


def _raw_keys(shard: data.Shard, seed=None) -> list[bytes]:
    return [bytes(raw.numpy()) for raw, _ in shard.records(seed)]


@pytest.mark.parametrize("form", data.tiny.FORMS)
def test_reads_both_forms_with_labels_and_shapes(tiny, form):
    dataset = data.open_dataset(tiny[form])
    assert (
        type(dataset).__name__
        == {"tfrecord": "TFRecordImageNet", "folders": "FolderImageNet"}[form]
    )
    assert dataset.num_classes == NUM_CLASSES
    assert dataset.num_examples("train") == NUM_CLASSES * PER_CLASS
    assert dataset.num_examples("eval") == NUM_CLASSES * EVAL_PER_CLASS

    images, labels = next(iter(dataset.input_fn("train", 8, 20)(_context(1, 0))))
    assert images.shape == (8, 20, 20, 3) and images.dtype == tf.float32
    assert labels.dtype == tf.int32 and set(labels.numpy()) <= set(range(NUM_CLASSES))
    # ImageNet normalisation: roughly zero-centred, unit-scale values.
    assert -3 < float(tf.reduce_mean(images)) < 3 and float(tf.math.reduce_std(images)) > 0.05

    eval_images, eval_labels = _eval_pass(dataset)
    assert eval_images.shape == (NUM_CLASSES * EVAL_PER_CLASS, 16, 16, 3)
    assert collections.Counter(eval_labels.tolist()) == {
        c: EVAL_PER_CLASS for c in range(NUM_CLASSES)
    }


def test_both_forms_agree_image_for_image(tiny):
    """Same JPEGs in both containers: each label must come with the same images."""
    passes = {form: _eval_pass(data.open_dataset(root)) for form, root in tiny.items()}

    def by_label(images, labels):
        return {c: sorted(float(x.sum()) for x in images[labels == c]) for c in range(NUM_CLASSES)}

    a, b = (by_label(*passes[form]) for form in data.tiny.FORMS)
    for c in range(NUM_CLASSES):
        np.testing.assert_allclose(a[c], b[c], rtol=1e-5)
    # The classes really differ (so a label mix-up would be caught).
    means = [np.mean(a[c]) for c in range(NUM_CLASSES)]
    assert len({round(m, 1) for m in means}) == NUM_CLASSES


@pytest.mark.parametrize(
    "form,split,pipelines",
    [
        ("tfrecord", "train", 3),  # 4 files over 3 pipelines: whole files
        ("tfrecord", "eval", 3),  # 2 files over 3 pipelines: record by record
        ("folders", "train", 3),
        ("folders", "eval", 2),
    ],
)
def test_shards_are_disjoint_and_complete(tiny, form, split, pipelines):
    dataset = data.open_dataset(tiny[form])
    everything = _raw_keys(dataset.shard(split, 1, 0))
    shards = [dataset.shard(split, pipelines, i) for i in range(pipelines)]
    keys = [_raw_keys(shard) for shard in shards]
    assert [shard.size() for shard in shards] == [len(k) for k in keys]
    assert all(keys), "every pipeline must get data"
    merged = [key for shard_keys in keys for key in shard_keys]
    assert len(merged) == len(set(merged)) == len(everything)
    assert set(merged) == set(everything)
    # A shuffled training epoch partitions the data across pipelines the same way
    # (with record-level sharding the subsets change per epoch, the partition holds).
    epoch = [_raw_keys(shard, tf.constant([7, 1], tf.int64)) for shard in shards]
    assert [len(k) for k in epoch] == [len(k) for k in keys]
    merged = [key for shard_keys in epoch for key in shard_keys]
    assert len(merged) == len(set(merged)) and set(merged) == set(everything)


def test_eval_pass_counts_every_example_once_across_pipelines(tiny):
    dataset = data.open_dataset(tiny["tfrecord"])
    total = sum(len(_eval_pass(dataset, pipelines=3, index=i, batch=2)[1]) for i in range(3))
    assert total == NUM_CLASSES * EVAL_PER_CLASS


@pytest.mark.parametrize("source", ["digits", "tfrecord"])
def test_stream_resumes_exactly_at_a_step(tiny, source):
    dataset = data.open_dataset("digits" if source == "digits" else tiny[source])
    batch, skip, size = 10, 7, 16  # 70 examples: several epochs of the tiny set
    stream = iter(dataset.input_fn("train", batch, size, seed=3)(_context(1, 0)))
    uninterrupted = [next(stream) for _ in range(skip + 3)][skip:]
    resumed = iter(dataset.input_fn("train", batch, size, seed=3, start_step=skip)(_context(1, 0)))
    for (x0, y0), (x1, y1) in zip(uninterrupted, [next(resumed) for _ in range(3)]):
        np.testing.assert_array_equal(y0.numpy(), y1.numpy())
        np.testing.assert_allclose(x0.numpy(), x1.numpy(), rtol=0, atol=1e-6)
    other_seed = next(iter(dataset.input_fn("train", batch, size, seed=4)(_context(1, 0))))
    assert not np.array_equal(
        other_seed[1].numpy(), uninterrupted[0][1].numpy()
    ) or not np.allclose(other_seed[0].numpy(), uninterrupted[0][0].numpy())


def test_digits_split_is_fixed_and_complete():
    digits = data.Digits()
    assert (digits.num_examples("train"), digits.num_examples("eval")) == (1437, 360)
    arrays = data.load_digits_arrays()
    assert arrays["train"][0].shape == (1437, 8, 8, 1)
    np.testing.assert_array_equal(arrays["eval"][1], data.load_digits_arrays()["eval"][1])
    images, labels = _eval_pass(digits, batch=64, image_size=32)
    assert images.shape == (360, 32, 32, 3) and sorted(labels) == sorted(arrays["eval"][1])


def test_preprocessing_shapes_and_centre_crop():
    import io

    from PIL import Image

    picture = np.zeros((40, 80, 3), np.uint8)
    picture[:, 20:60] = 255  # a white centre band exactly the width of the centre crop
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, "PNG")
    encoded = tf.constant(buffer.getvalue())
    centre = data.eval_image(encoded, 16).numpy()
    assert centre.shape == (16, 16, 3) and centre.min() > 200  # 35x35 crop inside the band
    crops = [data.train_image(encoded, 12, tf.constant([s, 0], tf.int64)).numpy() for s in range(4)]
    assert all(c.shape == (12, 12, 3) for c in crops)
    assert len({float(c.sum()) for c in crops}) > 1  # different seeds, different crops


# ------------------------------------------------------------------- errors
def test_error_for_missing_directory(tmp_path):
    with pytest.raises(data.DataError, match="does not exist"):
        data.open_dataset(str(tmp_path / "nowhere"))


def test_error_for_empty_directory(tmp_path):
    with pytest.raises(data.DataError, match="imagenet2012-train.tfrecord"):
        data.open_dataset(str(tmp_path))


def test_error_for_folders_without_classes_or_images(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(data.DataError, match="no class folders"):
        data.open_dataset(str(tmp_path))
    (tmp_path / "train" / "n01").mkdir()
    (tmp_path / "train" / "n01" / "notes.txt").write_text("not an image")
    with pytest.raises(data.DataError, match="hold no images"):
        data.open_dataset(str(tmp_path))


def test_error_for_eval_classes_missing_from_train(tmp_path):
    root = str(tmp_path / "d")
    data.write_tiny_imagenet(root, form="folders", num_classes=2, images_per_class=1, size=8)
    os.makedirs(os.path.join(root, "val", "n99999999"))
    with pytest.raises(data.DataError, match="classes that train/ does not"):
        data.open_dataset(root)


def test_error_for_malformed_and_incomplete_tfrecords(tmp_path):
    root = tmp_path / "bad"
    root.mkdir()
    (root / "imagenet2012-train.tfrecord-00000-of-00002").write_bytes(b"not a tfrecord at all")
    with pytest.raises(data.DataError, match="found 1 of 2"):
        data.open_dataset(str(root))
    (root / "imagenet2012-train.tfrecord-00001-of-00002").write_bytes(b"")
    (root / "label.labels.txt").write_text("a\nb\n")
    with pytest.raises(data.DataError, match="not a tfds image-classification TFRecord"):
        data.open_dataset(str(root))


def test_error_for_tfrecords_with_other_features(tmp_path):
    path = str(tmp_path / "imagenet2012-train.tfrecord-00000-of-00001")
    with tf.io.TFRecordWriter(path) as writer:
        feature = {"pixels": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0]))}
        writer.write(
            tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
        )
    with pytest.raises(data.DataError, match="expected features 'image'"):
        data.TFRecordImageNet(str(tmp_path), num_classes=2)


def test_write_tiny_refuses_non_empty_directory(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        data.write_tiny_imagenet(str(tmp_path))
    assert (tmp_path / "keep.txt").read_text() == "mine"
