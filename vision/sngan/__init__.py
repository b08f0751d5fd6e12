"""Class-conditional SN-GAN.

vision.sngan.layers     spectrally normalised layers, conditional batch norm
vision.sngan.networks   generator and projection discriminator
vision.sngan.learning   config, hinge losses, the D and G replica steps, EMA generator
vision.sngan.training   `train(config, run_dir)`: a run with samples, IS/FID, checkpoints
vision.sngan.cli        `replicator train sngan`
"""
