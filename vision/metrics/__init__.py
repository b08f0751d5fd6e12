"""Metrics of the vision models.

vision.metrics.classification    top-1 / top-5 counts of one replica's batch (with padding)
vision.metrics.gan               Inception Score and FID from a classifier the user supplies
vision.metrics.digits_classifier the classifier the GAN metrics use for the digits data
"""
