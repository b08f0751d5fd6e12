"""Vision baselines on the replication layer: ResNet-50 classification and SN-GAN.

Packages (imported explicitly; this package imports nothing itself, so
`import vision.data` stays cheap and TensorFlow devices stay unconfigured):

  vision.resnet     ResNet v1.5: networks, learning (config, schedule, replica step),
                    training (the run), cli (`replicator train resnet50`)
  vision.sngan      class-conditional SN-GAN: networks, layers, learning, training, cli
                    (`replicator train sngan`)
  vision.common     what both share: run directories, the training loop, batch norm,
                    precision, CLI helpers, `--workers K`
  vision.data       ImageNet (tfds TFRecords, class folders), digits, tiny generator;
                    classification and GAN preprocessing
  vision.metrics    top-1/top-5, Inception Score and FID, the digits classifier
"""
