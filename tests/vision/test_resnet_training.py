"""A small ResNet learns real data (scikit-learn digits) on two replicas, in both precisions."""

from __future__ import annotations

import pytest

import replication
from vision.resnet import learning as classification
from vision.resnet import training


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_small_resnet_reaches_95_percent_on_digits_with_two_replicas(precision):
    repl = replication.make("cpu:2")
    config = classification.ClassificationConfig(
        data="digits",
        image_size=8,
        blocks_per_group=(1, 1),
        channels_per_group=(32, 64),
        stem_channels=16,
        batch_size=64,
        steps=300,
        base_learning_rate=0.8,
        warmup_steps=20,
        weight_decay=5e-4,
        precision=precision,
        replicas="cpu:2",
        log_every=100,
    )
    lines = []
    results = training.train(config, repl=repl, print_fn=lines.append)
    assert results["step"] == 300
    assert results["count"] == 360  # the whole test split, each image once
    assert results["top1"] >= 0.95, lines
    assert results["top5"] >= results["top1"]
