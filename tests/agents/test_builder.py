"""The D4PG builder's environment: pixel defaults (stack, repeat), the chosen camera, and
standardised features."""

import numpy as np
import pytest

import environments
from agents.d4pg import builder
from agents.d4pg.config import D4PGConfig

pytestmark = pytest.mark.timeout(120)


def test_pixel_environment_uses_frame_stack_3_the_domain_repeat_and_the_camera():
    config = D4PGConfig.from_overrides({"from_pixels": True, "image_size": 24})
    env = builder.make_environment(config, "cartpole:swingup", seed=0)
    spec = environments.make_environment_spec(env)
    assert spec.observations.shape == (24, 24, 9)  # 3 stacked RGB frames.
    assert spec.rewards.maximum == 8.0  # cartpole: action repeat 8.
    frames = {}
    for camera in (0, 1):
        cfg = D4PGConfig.from_overrides({"camera_id": camera}, base=config)
        frames[camera] = builder.make_environment(cfg, "cartpole:swingup", seed=0).reset()
    assert not np.array_equal(frames[0].observation, frames[1].observation)
    features = builder.make_environment(D4PGConfig(), "cartpole:swingup", seed=0)
    assert environments.make_environment_spec(features).rewards.maximum == 1.0


def test_normalize_observations_gives_the_standardized_features():
    config = D4PGConfig.from_overrides({"normalize_observations": "true"})
    env = builder.make_environment(config, "reacher:easy", seed=0)
    plain = builder.make_environment(D4PGConfig(), "reacher:easy", seed=0)
    stats = env.environment.standardization
    assert stats is not None and plain.environment.standardization is None
    np.testing.assert_allclose(
        env.reset().observation, stats.apply_(plain.reset().observation), rtol=1e-6
    )
