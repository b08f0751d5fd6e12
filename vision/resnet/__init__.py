"""ResNet v1.5 image classification.

vision.resnet.networks   the ResNet Sonnet modules
vision.resnet.learning   config, learning-rate schedule, the per-replica step (`Classifier`)
vision.resnet.training   `train(config, run_dir)`: a run with evaluation and checkpoints
vision.resnet.cli        `replicator train resnet50`
"""
