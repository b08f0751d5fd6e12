"""Vision baselines on the replication layer: ResNet-50 classification and SN-GAN.

Modules (imported explicitly; this package imports nothing itself, so
`import vision.data` stays cheap and TensorFlow devices stay unconfigured):

  vision.resnet            ResNet v1.5 Sonnet modules, cross-replica BatchNorm
  vision.precision         float32 / bfloat16 (bf16 compute, float32 weights)
  vision.data              ImageNet (tfds TFRecords, class folders), digits, tiny generator
  vision.classification    the per-replica training step, evaluation, train()
  vision.resnet_cli        `replicator train resnet50`
  vision.training_common   run directories: config, metrics, checkpoints, progress
  vision.sngan*, gan_*     class-conditional SN-GAN and GAN metrics
"""
