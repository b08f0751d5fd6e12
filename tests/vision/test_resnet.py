"""ResNet v1.5 modules: structure, batch norm paths, bfloat16 dtypes, learning-rate schedule."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import replication
from vision.common.normalization import BatchNorm
from vision.resnet import learning as classification
from vision.resnet import networks as resnet

pytestmark = pytest.mark.timeout(300)


def _tiny(precision="float32", **kwargs):
    return resnet.ResNet(
        (1, 1),
        (16, 32),
        num_classes=5,
        stem="small",
        stem_channels=8,
        precision=precision,
        **kwargs,
    )


def test_resnet50_has_the_reference_parameter_count():
    model = resnet.resnet50()
    model(tf.zeros([1, 32, 32, 3]), is_training=False)  # 32x32 builds the same variables
    count = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert count == 25_557_032  # torchvision/MLPerf ResNet-50 v1.5: bias-free convs
    assert model.downsampling == 32
    # Stride on the 3x3 convolution of downsampling blocks (v1.5), not on the first 1x1.
    first_of_group_1 = next(b for b in model.blocks if b.name == "group_1_block_0")
    assert [c.stride for c in first_of_group_1.convs] == [1, 2, 1]
    assert first_of_group_1.projection.stride == 2
    v1 = resnet.resnet50(stride_in_1x1=True)  # the original v1, as Keras' ResNet50
    assert [c.stride for c in v1.blocks[3].convs] == [2, 1, 1]


@pytest.mark.parametrize("zero_init", [True, False])
def test_zero_init_last_bn_makes_blocks_start_as_identity(zero_init):
    model = _tiny(zero_init_last_bn=zero_init)
    model(tf.zeros([1, 8, 8, 3]), is_training=False)
    scales = [b.bns[2].scale.numpy() for b in model.blocks]
    assert all((s == 0).all() for s in scales) == zero_init
    assert all((b.bns[0].scale.numpy() == 1).all() for b in model.blocks)


def test_image_size_too_small_for_the_stem_is_refused():
    model = resnet.resnet50()
    with pytest.raises(ValueError, match="at least 32x32.*small' stem"):
        model.check_image_size(16)
    model.check_image_size(32)
    _tiny().check_image_size(2)  # small stem, one stride-2 group


def test_weight_decay_applies_to_the_53_convolutions_and_the_head_of_resnet50():
    model = resnet.resnet50()
    model(tf.zeros([1, 32, 32, 3]), is_training=False)
    decayed = resnet.weight_decay_variables(model)
    # 1 stem + 16 blocks x 3 + 4 projection convolutions = 53 kernels, plus the head's weight.
    convolutions = [v for v in decayed if v.shape.rank == 4]
    assert len(convolutions) == 53
    assert [v.name for v in decayed if v.shape.rank == 2] == ["resnet50/logits/w:0"]
    assert len(decayed) == 54
    # Nothing else: no batch-norm scale or offset, no bias.
    decayed_refs = {v.ref() for v in decayed}
    others = [v for v in model.trainable_variables if v.ref() not in decayed_refs]
    assert others and all(
        n.endswith(("scale:0", "offset:0", "b:0")) for n in (v.name for v in others)
    ), [v.name for v in others]


def test_fused_single_replica_batch_norm_matches_cross_replica_maths():
    """The fused fast path (1 replica) computes what the all-reduce path does."""
    x = tf.random.stateless_normal([6, 5, 5, 4], seed=[1, 2]) * 3.0 + 1.0
    repl = replication.make("cpu")
    with repl.scope():
        fused, reference = BatchNorm(name="fused"), BatchNorm(name="reference")
        fused(x, is_training=False), reference(tf.reshape(x, [-1, 4]), is_training=False)

    def step(x):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y_fused = fused(x, is_training=True)
            # Same maths through the unfused path: a rank-4 input reshaped to rank 2
            # is not eligible for the fused kernel.
            y_ref = tf.reshape(reference(tf.reshape(x, [-1, 4]), is_training=True), x.shape)
            weights = tf.range(4, dtype=tf.float32) + 1.0
            losses = [tf.reduce_sum(tf.sin(y) * weights) for y in (y_fused, y_ref)]
        return (y_fused, y_ref, *[tape.gradient(loss, x) for loss in losses])

    y_fused, y_ref, g_fused, g_ref = repl.run(tf.function(step), x)
    np.testing.assert_allclose(y_fused, y_ref, atol=2e-5)
    np.testing.assert_allclose(g_fused, g_ref, atol=2e-5)
    for a, b in [
        (fused.moving_mean, reference.moving_mean),
        (fused.moving_variance, reference.moving_variance),
    ]:
        np.testing.assert_allclose(np.ravel(a.value), np.ravel(b.value), rtol=1e-5)
    # The moving variance is the population (biased) variance of the batch.
    _, variance = tf.nn.moments(x, [0, 1, 2])
    np.testing.assert_allclose(np.ravel(fused.moving_variance.value), variance, rtol=1e-5)


def _op_types(graph: tf.Graph) -> list[str]:
    """Op types of `graph` and of every function in its library (nested calls included)."""
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return [node.op for node in nodes]


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_single_replica_training_step_runs_every_batch_norm_as_the_fused_kernel(precision):
    """With one replica the fused kernel does the work (several times faster on CPU).

    Sonnet's CrossReplicaBatchNorm sets `self._fused = False` on first call; a flag
    of that name in our subclass was overwritten and the unfused ops always ran.
    """
    repl = replication.make("cpu")
    config = classification.ClassificationConfig(
        blocks_per_group=(1, 1),
        channels_per_group=(16, 32),
        stem_channels=8,
        precision=precision,
        batch_size=4,
        steps=4,
    )
    classifier = classification.Classifier(config, repl, num_classes=5, image_size=8)

    def input_fn(ctx):
        images = tf.random.stateless_normal([4, 8, 8, 3], seed=[0, 1])
        return tf.data.Dataset.from_tensors((images, tf.constant([0, 1, 2, 3]))).repeat()

    iterator = iter(repl.distribute(input_fn))
    graph = classifier._train_fn.get_concrete_function(iterator).graph  # pylint: disable=protected-access
    ops = _op_types(graph)
    batch_norms = [m for m in classifier.model.submodules if isinstance(m, BatchNorm)]
    assert len(batch_norms) == 9  # stem, 2 blocks x 3, 2 projections
    assert ops.count("FusedBatchNormV3") == len(batch_norms)
    assert ops.count("FusedBatchNormGradV3") == len(batch_norms)
    # The moments are not also computed by hand (the unfused path's squared means).
    assert "SquaredDifference" not in ops and "Square" not in ops
    assert np.isfinite(float(classifier.train_step(iterator)["loss"]))


@pytest.mark.parametrize("spec", ["cpu", "cpu:2"])
def test_bfloat16_computes_in_bfloat16_and_keeps_float32_state(spec):
    repl = replication.make(spec)
    config = classification.ClassificationConfig(
        blocks_per_group=(1, 1),
        channels_per_group=(16, 32),
        stem_channels=8,
        precision="bfloat16",
        batch_size=8,
        steps=4,
        replicas=spec,
    )
    classifier = classification.Classifier(config, repl, num_classes=5, image_size=8)
    model = classifier.model
    assert model.compute_dtype == tf.bfloat16
    conv_dtypes = []

    def forward(images):
        # The conv runs on a bfloat16 input and returns float32 logits.
        hidden = model.stem_conv(tf.cast(images, model.compute_dtype))
        conv_dtypes.append(hidden.dtype)
        return model(images, is_training=False)

    logits = repl.run(tf.function(forward), tf.zeros([4, 8, 8, 3]))
    assert conv_dtypes[0] == tf.bfloat16
    assert all(v.dtype == tf.float32 for v in repl.local_results(logits))

    def input_fn(ctx):
        rng = np.random.RandomState(0)
        images = rng.normal(size=(16, 8, 8, 3)).astype(np.float32)
        labels = rng.randint(0, 5, size=16).astype(np.int32)
        return (
            tf.data.Dataset.from_tensor_slices((images, labels))
            .repeat()
            .batch(ctx.get_per_replica_batch_size(8))
        )

    iterator = iter(repl.distribute(input_fn))
    for _ in range(2):
        metrics = classifier.train_step(iterator)
    assert np.isfinite(float(metrics["loss"]))
    assert int(classifier.step.numpy()) == 2
    floating = [v for v in classifier.variables if v.dtype.is_floating]
    slots = [v for v in classifier.optimizer.variables if v.dtype.is_floating]
    assert floating and slots
    assert {v.dtype for v in floating + slots} == {tf.float32}


def test_top1_top5_counts_known_logits_with_padding_over_two_replicas():
    from vision.metrics.classification import top_k_counts

    repl = replication.make("cpu:2")
    # 6 classes; per example the true class's rank is chosen by hand.
    logits = np.array(
        [
            [9, 1, 2, 3, 4, 5],  # label 0: rank 1 -> top-1 and top-5
            [1, 9, 2, 3, 4, 5],  # label 2: rank 5 -> top-5 only
            [0, 1, 2, 3, 4, 5],  # label 0: rank 6 -> neither
            [5, 4, 3, 9, 1, 0],  # label 3: rank 1, but padding (mask 0): not counted
            [1, 2, 3, 4, 5, 9],  # label 4: rank 2 -> top-5 only
            [1, 2, 3, 4, 9, 5],  # label 4: rank 1 -> top-1 and top-5
            [9, 8, 7, 6, 5, 4],  # label 5: rank 6 -> neither
            [9, 8, 7, 6, 5, 4],  # label 0: rank 1, but padding: not counted
        ],
        np.float32,
    )
    labels = np.array([0, 2, 0, 3, 4, 4, 5, 0], np.int32)
    mask = np.array([1, 1, 1, 0, 1, 1, 1, 0], np.float32)

    def input_fn(ctx):
        per_replica = ctx.get_per_replica_batch_size(8)
        return tf.data.Dataset.from_tensor_slices((logits, labels, mask)).batch(per_replica)

    batch = next(iter(repl.distribute(input_fn)))
    per_replica = repl.local_results(repl.run(tf.function(top_k_counts), *batch))
    assert [int(c["count"]) for c in per_replica] == [3, 3]  # each replica had real examples
    totals = repl.reduce(repl.run(tf.function(top_k_counts), *batch), "sum")
    assert {k: int(v) for k, v in totals.items()} == {"top1": 2, "top5": 4, "count": 6}


def test_learning_rate_schedule_warmup_cosine_and_step():
    config = classification.ClassificationConfig(
        batch_size=512, base_learning_rate=0.1, steps=100, warmup_steps=10
    )
    lr = lambda c, t: float(classification.learning_rate(tf.constant(t), c))  # noqa: E731
    peak = 0.2  # linear scaling: 0.1 * 512 / 256
    assert lr(config, 0) == pytest.approx(peak / 10)
    assert lr(config, 9) == pytest.approx(peak)
    assert lr(config, 10) == pytest.approx(peak)
    assert lr(config, 55) == pytest.approx(peak / 2, rel=1e-5)  # half-way through the cosine
    assert lr(config, 100) == pytest.approx(0.0, abs=1e-7)
    step = classification.ClassificationConfig(
        batch_size=256, steps=90, warmup_steps=0, schedule="step"
    )
    assert [lr(step, t) for t in (0, 29, 30, 60, 80, 89)] == pytest.approx(
        [0.1, 0.1, 0.01, 0.001, 0.0001, 0.0001]
    )


def test_imagenet_defaults_are_90_epochs_with_5_of_warmup():
    config = classification.ClassificationConfig()
    assert (config.epochs, config.warmup_epochs, config.steps) == (90, 5, None)
    resolved = config.resolve(train_examples=1_281_167)  # ImageNet's training split
    steps_per_epoch = 1_281_167 / 256
    assert resolved.steps == int(np.ceil(90 * steps_per_epoch)) == 450_411
    assert resolved.warmup_steps == round(5 * steps_per_epoch) == 25_023
    # A short run keeps its warmup to a tenth of its steps.
    short = classification.ClassificationConfig(steps=12, batch_size=16).resolve(1437)
    assert (short.steps, short.warmup_steps) == (12, 1)
    assert classification.ClassificationConfig(epochs=2, batch_size=100).resolve(1437).steps == 29
    with pytest.raises(classification.ConfigError, match="--steps"):
        config.resolve(train_examples=None)


def test_config_errors_name_the_field():
    with pytest.raises(classification.ConfigError, match="precision"):
        classification.ClassificationConfig(precision="float16").validate()
    with pytest.raises(classification.ConfigError, match="one entry per group"):
        classification.ClassificationConfig(
            blocks_per_group=(1,), channels_per_group=(8, 16)
        ).validate()
    with pytest.raises(classification.ConfigError, match="schedule"):
        classification.ClassificationConfig(schedule="linear").validate()


def test_checkpoint_round_trip_restores_everything(tmp_path):
    repl = replication.make("cpu")
    config = classification.ClassificationConfig(
        blocks_per_group=(1,), channels_per_group=(8,), stem_channels=4, batch_size=4
    )
    a = classification.Classifier(config, repl, num_classes=3, image_size=4)

    def input_fn(ctx):
        x = tf.random.stateless_normal([4, 4, 4, 3], seed=[0, 1])
        return tf.data.Dataset.from_tensors((x, tf.constant([0, 1, 2, 0]))).repeat()

    a.train_step(iter(repl.distribute(input_fn)))
    path = a.checkpoint().save(str(tmp_path / "ckpt"))
    b = classification.Classifier(config, repl, num_classes=3, image_size=4)
    b.checkpoint().restore(path).assert_existing_objects_matched()
    assert int(b.step.numpy()) == 1
    state_a = a.variables + a.optimizer.variables
    state_b = b.variables + b.optimizer.variables
    assert len(state_a) == len(state_b) > 10
    for va, vb in zip(state_a, state_b):
        np.testing.assert_array_equal(va.numpy(), vb.numpy(), err_msg=va.name)
