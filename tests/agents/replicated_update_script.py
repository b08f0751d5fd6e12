"""Run by test_replicated_update.py in a fresh process (logical CPUs need a fresh TF).

Trains two D4PG learners on identical fixed data: `cpu:2` with per-replica batch B and
`cpu` with batch 2B, from identical initial weights; prints the largest differences.
"""

import json
import sys

import replication

REPL_2 = replication.make("cpu:2")  # Before any other TensorFlow op in this process.
REPL_1 = replication.make("cpu")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from dm_env import specs  # noqa: E402

from agents.d4pg.config import D4PGConfig  # noqa: E402
from agents.d4pg.learning import D4PGLearner, Transition  # noqa: E402
from environments import EnvironmentSpec  # noqa: E402

PER_REPLICA = 8
STEPS = 5


def _spec(pixels: bool) -> EnvironmentSpec:
    obs = specs.Array((12, 12, 3), np.uint8) if pixels else specs.Array((5,), np.float32)
    return EnvironmentSpec(
        obs,
        specs.BoundedArray((2,), np.float32, -1.0, 1.0),
        specs.Array((), np.float32),
        specs.BoundedArray((), np.float32, 0, 1),
    )


def _data(spec, rows: int) -> Transition:
    rng = np.random.default_rng(0)
    obs_shape = (rows,) + spec.observations.shape
    if spec.observations.dtype == np.uint8:

        def obs():
            return rng.integers(0, 256, obs_shape).astype(np.uint8)
    else:

        def obs():
            return rng.normal(0, 1, obs_shape).astype(np.float32)

    return Transition(
        obs(),
        rng.uniform(-1, 1, (rows, 2)).astype(np.float32),
        rng.normal(5, 3, rows).astype(np.float32),
        rng.choice([0.0, 0.95], rows).astype(np.float32),
        obs(),
    )


def _input_fn(data: Transition, per_replica: int):
    def input_fn(ctx):
        # Element i goes to replica i % num_replicas: each replica sees its own fixed half.
        return tf.data.Dataset.from_tensor_slices(data).batch(per_replica).repeat()

    return input_fn


def _all_state(learner: D4PGLearner):
    (online, target) = learner.get_variables(["all", "target"])
    return online + target + learner.optimizer_state()


def main(
    pixels: bool,
    clip: bool,
    updates_per_call: int = 1,
    lr_decay_updates: int = 0,
    target_update_rate: float = 0.0,
) -> dict:
    spec = _spec(pixels)
    overrides = {
        "policy_layers": "16,16",
        "critic_layers": "32,16",
        "num_atoms": 11,
        "vmin": -20,
        "vmax": 20,
        "target_update_period": 2,
        "conv_channels": "4,4",
        "conv_strides": "2,1",
        "conv_kernels": "3,3",
        "torso_output_size": 8,
        "policy_lr": 1e-4,
        "critic_lr": 1e-4,
        "updates_per_call": updates_per_call,
        "lr_decay_updates": lr_decay_updates,
        "target_update_rate": target_update_rate,
    }
    # A small clipping norm so that clipping of the averaged gradient is exercised too.
    results = {}
    if True:
        # Small clips so that both act (global norm of the averaged gradient, per-sample
        # dQ/da); pixels also go through the random-shift augmentation.
        overrides.update(
            clipping=clip,
            max_gradient_norm=0.05,
            dqda_clipping=1e-3 if clip else 0.0,
            from_pixels=pixels,
            random_shift=pixels,
            random_shift_pad=2,
        )
        config = D4PGConfig.from_overrides({**overrides, "batch_size": 2 * PER_REPLICA})
        data = _data(spec, 2 * PER_REPLICA)
        two = D4PGLearner(config, spec, REPL_2, _input_fn(data, PER_REPLICA))
        one = D4PGLearner(config, spec, REPL_1, _input_fn(data, 2 * PER_REPLICA))
        for src, dst in zip(
            two.networks.all_variables() + two.target_networks.all_variables(),
            one.networks.all_variables() + one.target_networks.all_variables(),
        ):
            dst.assign(src.numpy())
        initial = [v.copy() for v in one.get_variables(["all"])[0]]
        for _ in range(STEPS):
            metrics_two, metrics_one = two.step(), one.step()
        state_two, state_one = _all_state(two), _all_state(one)
        results[f"clip={clip}"] = {
            "num_arrays": len(state_one),
            "max_param_diff": max(
                float(np.max(np.abs(a - b))) for a, b in zip(state_two, state_one)
            ),
            "max_param_change": max(
                float(np.max(np.abs(a - b))) for a, b in zip(one.get_variables(["all"])[0], initial)
            ),
            "metric_diff": max(abs(metrics_two[k] - metrics_one[k]) for k in metrics_one),
            "steps": [two.num_steps, one.num_steps],
            "clip_fractions": [
                metrics_one["critic_clipped"],
                metrics_one["policy_clipped"],
                metrics_one["dqda_clip_fraction"],
            ],
            "replicas": [REPL_2.num_replicas, REPL_1.num_replicas],
            "updates_per_call": updates_per_call,
            "final_policy_lr": metrics_two.get("policy_lr"),
        }
    return results


if __name__ == "__main__":
    # Features with clipping (the all-reduce-then-clip path), pixels without (conv torso),
    # and 3 updates per compiled call (a target copy, period 2, falls inside each call)
    # with both learning rates decaying until update 10 of the 15 (the rates are
    # variables every replica assigns); and Polyak targets, which every replica moves
    # after each update.
    results = {
        "features": main(False, clip=True),
        "pixels": main(True, clip=False),
        "fused": main(False, clip=True, updates_per_call=3, lr_decay_updates=10),
        "polyak": main(False, clip=True, target_update_rate=0.2),
    }
    print("RESULT " + json.dumps(results))
    sys.stdout.flush()
