"""The D4PG builder's environment: pixel defaults (stack, repeat) and the chosen camera."""

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
