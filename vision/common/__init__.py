"""What the vision trainers share.

vision.common.run_dir        run directories: config, metrics, checkpoints, resume
vision.common.loop           the training loop: progress, NaN check, cadence, graceful stop
vision.common.normalization  the cross-replica batch norm both models use
vision.common.precision      float32 / bfloat16 (bf16 compute, float32 weights)
vision.common.cli            flags, config resolution and exit statuses of `train MODEL`
vision.common.workers        `--workers K`: K local processes, one multi-worker strategy
"""
