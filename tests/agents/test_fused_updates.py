"""K updates in one compiled call equal K calls of one update (same data, same state).

With one replica and XLA the K updates run as one XLA computation on K stacked batches
(`fuse_updates_per_call`, the default); without it, as a graph loop of K compiled updates.
Both must equal K calls of one update.
"""

import numpy as np
import pytest
import reverb
import tensorflow as tf
from dm_env import specs

import replication
from agents.d4pg import variables
from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import D4PGLearner, Transition
from agents.d4pg.replay import make_replay_server
from environments import EnvironmentSpec

pytestmark = pytest.mark.timeout(300)

SPEC = EnvironmentSpec(
    observations=specs.Array((5,), np.float32),
    actions=specs.BoundedArray((2,), np.float32, -1.0, 1.0),
    rewards=specs.Array((), np.float32),
    discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
)
BATCH = 8
BASE = {
    "policy_layers": "16,16",
    "critic_layers": "32,16",
    "num_atoms": 11,
    "vmin": -20,
    "vmax": 20,
    "batch_size": BATCH,
    # 3 does not divide 4: target copies at updates 0, 3 and 6 fall inside fused calls.
    "target_update_period": 3,
    "policy_lr": 1e-3,
    "critic_lr": 1e-3,
    "max_gradient_norm": 0.5,  # Small enough that clipping is active.
}


def random_transitions(rows: int, seed: int) -> Transition:
    """`rows` distinct transitions of SPEC's shapes, rewards and discounts varied."""
    rng = np.random.default_rng(seed)
    return Transition(
        rng.normal(size=(rows, 5)).astype(np.float32),
        rng.uniform(-1, 1, (rows, 2)).astype(np.float32),
        rng.normal(5, 3, rows).astype(np.float32),
        rng.choice([0.0, 0.95], rows).astype(np.float32),
        rng.normal(size=(rows, 5)).astype(np.float32),
    )


def _input_fn(ctx):
    # 16 distinct batches in a fixed order: every update of a call sees a different one.
    data = random_transitions(16 * BATCH, seed=0)
    return tf.data.Dataset.from_tensor_slices(data).batch(BATCH).repeat()


def _learner(
    updates_per_call: int,
    publish_period: int = 10,
    fuse: bool = True,
    overrides: dict | None = None,
    **kwargs,
) -> D4PGLearner:
    config = D4PGConfig.from_overrides(
        {
            **BASE,
            "updates_per_call": updates_per_call,
            "publish_period": publish_period,
            "fuse_updates_per_call": fuse,
            **(overrides or {}),
        }
    )
    return D4PGLearner(config, SPEC, replication.make("cpu"), _input_fn, **kwargs)


def _state(learner):
    online, target = learner.get_variables(["all", "target"])
    return online + target + learner.optimizer_state()


# A decay that ends at update 6, inside the second call: each update of a call must use
# its own rate.
DECAY = {"lr_decay_updates": 6, "lr_final_scale": 0.1}
# Polyak targets move after every update, inside the fused calls too.
POLYAK = {"target_update_rate": 0.2}


@pytest.mark.parametrize(
    "overrides",
    [{}, DECAY, POLYAK],
    ids=["constant_rates", "decaying_rates", "polyak_targets"],
)
@pytest.mark.parametrize("fuse", [True, False], ids=["one_xla_computation", "graph_loop"])
def test_four_fused_updates_equal_four_single_updates(fuse, overrides):
    fused = _learner(4, fuse=fuse, overrides=overrides)
    single = _learner(1, overrides=overrides)
    for src, dst in zip(
        fused.networks.all_variables() + fused.target_networks.all_variables(),
        single.networks.all_variables() + single.target_networks.all_variables(),
    ):
        dst.assign(src.numpy())
    initial_target = [v.copy() for v in single.get_variables(["target"])[0]]

    fused_metrics = [fused.step() for _ in range(2)]
    single_metrics = [single.step() for _ in range(8)]

    assert fused.num_steps == single.num_steps == 8
    state_fused, state_single = _state(fused), _state(single)
    assert len(state_fused) == len(state_single) and len(fused.optimizer_state()) > 0
    for a, b in zip(state_fused, state_single):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # The target networks really were copied inside a fused call (at update 6).
    target_now = single.get_variables(["target"])[0]
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(target_now, initial_target)) > 1e-4
    # A fused call reports the mean of its updates' metrics.
    for call, metrics in enumerate(fused_metrics):
        for name, value in metrics.items():
            expected = np.mean([m[name] for m in single_metrics[4 * call : 4 * call + 4]])
            np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "graph_loop"])
@pytest.mark.parametrize("target", [False, True], ids=["online", "target_policy"])
def test_weights_are_published_when_a_call_crosses_a_multiple_of_the_period(fuse, target):
    server = make_replay_server(D4PGConfig.from_overrides(BASE), SPEC)
    try:
        client = reverb.Client(f"localhost:{server.port}")
        learner = _learner(
            4,
            publish_period=6,
            fuse=fuse,
            overrides={"act_with_target_policy": target},
            replay_client=client,
        )
        learner.publish_variables()  # As `builder.make_learner` does: version 0.
        source = variables.VariableClient(client)
        published = []
        for _ in range(5):  # Calls end at updates 4, 8, 12, 16, 20.
            learner.step()
            learner.wait_for_publish()  # `step` does not wait for its publish to arrive.
            source.update(wait=True)
            published.append(source.version)
            if source.version == learner.num_steps:  # Published by this call: its result.
                acting = learner.acting_weights()
                assert len(source.weights) == len(acting)
                for pulled, now in zip(source.weights, acting):
                    np.testing.assert_array_equal(pulled, now)
        # 8 crosses 6, 12 reaches 12, 16 crosses nothing, 20 crosses 18.
        assert published == [0, 8, 12, 12, 20]
    finally:
        server.stop()


def test_the_fused_computation_holds_one_copy_of_the_update():
    # Compile time grows with the update's copies in the computation: a first update
    # outside the loop (the loop's initial metrics) doubled it. The loop body's copy is
    # counted here by its matrix products, against those of one compiled update.
    learner = _learner(4)
    stacked = next(iter(_input_fn(None).batch(4)))
    fused_hlo = learner._fused_step.experimental_get_compiler_ir(stacked)(stage="hlo")
    one = tf.nest.map_structure(lambda x: x[0], stacked)
    single_hlo = learner._replica_step.experimental_get_compiler_ir(one)(stage="hlo")
    dots = single_hlo.count(" dot(")
    assert dots > 20  # Forward and backward passes of the critic and the policy.
    # One copy (and a few products of the loop's bookkeeping), not two.
    assert dots <= fused_hlo.count(" dot(") < 1.5 * dots
