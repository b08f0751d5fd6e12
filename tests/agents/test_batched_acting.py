"""Batched acting: one policy call for K environments equals K single actors."""

import numpy as np
import pytest
import reverb
import tensorflow as tf

import environments
from agents.d4pg import builder, networks, variables
from agents.d4pg.acting import BatchedD4PGActor, D4PGActor
from agents.d4pg.adders import NStepTransitionAdder
from agents.d4pg.config import D4PGConfig
from agents.d4pg.numpy_policy import NumpyPolicy
from agents.d4pg.replay import replay_signature
from agents.environment_loop import BatchedEnvironmentLoop, EnvironmentLoop

pytestmark = pytest.mark.timeout(180)

K = 3
SEEDS = [11, 22, 33]
TASK = "cartpole:balance"


def _policy(config, spec, pixels=False):
    tf.random.set_seed(1)
    nets = networks.make_networks(config, spec)
    act = spec.actions
    policy = NumpyPolicy(config, pixels=pixels, action_low=act.minimum, action_high=act.maximum)
    policy.set_weights([v.numpy() for v in nets.acting_variables()])
    return policy


@pytest.mark.parametrize("pixels", [False, True])
def test_batched_policy_equals_single_calls(pixels):
    config = D4PGConfig.from_overrides(
        {
            "policy_layers": "32,16",
            "conv_channels": "4,4",
            "conv_strides": "2,1",
            "conv_kernels": "3,3",
            "torso_output_size": 8,
            "image_size": 24,
        }
    )
    env = environments.make(TASK, seed=0, from_pixels=pixels, height=24, width=24)
    spec = environments.make_environment_spec(env)
    policy = _policy(config, spec, pixels)
    rng = np.random.default_rng(0)
    shape = (5,) + spec.observations.shape
    if pixels:
        observations = rng.integers(0, 256, shape).astype(np.uint8)
    else:
        observations = (3 * rng.normal(size=shape)).astype(np.float32)
    batched = policy.batch(observations)
    assert batched.shape == (5,) + spec.actions.shape
    single = np.stack([policy(o) for o in observations])
    np.testing.assert_allclose(batched, single, rtol=1e-5, atol=1e-6)
    assert np.ptp(batched) > 1e-3  # Different observations, different actions.


class _BangBangPolicy(NumpyPolicy):
    """Actions +-0.5 by the sign of the policy's: batched and single matrix products may
    round differently (1e-7), which the physics would amplify; signs do not change."""

    def __call__(self, observation):
        return np.where(super().__call__(observation) > 0, 0.5, -0.5).astype(np.float32)

    def batch(self, observations):
        return np.where(super().batch(observations) > 0, 0.5, -0.5).astype(np.float32)


def _read_table(client, table):
    size = client.server_info()[table].current_size
    samples = client.sample(
        table, num_samples=size, emit_timesteps=False, unpack_as_table_signature=True
    )
    return [s.data for s in samples]


def test_k_adders_write_the_items_of_k_single_actors():
    config = D4PGConfig.from_overrides({"policy_layers": "16,16", "n_step": 3})
    make = [lambda s=s: environments.make(TASK, seed=s, action_repeat=10) for s in SEEDS]
    spec = environments.make_environment_spec(make[0]())  # 100-step episodes.
    policy = _BangBangPolicy(config, pixels=False, action_low=-1.0, action_high=1.0)
    policy.set_weights(_policy(config, spec)._weights)
    names = [f"{side}_{j}" for side in ("single", "batched") for j in range(K)]
    # FIFO queues return each writer's items in the order it wrote them.
    server = reverb.Server(
        [
            reverb.Table.queue(name, max_size=10_000, signature=replay_signature(spec))
            for name in names
        ]
    )
    try:
        client = reverb.Client(f"localhost:{server.port}")

        def adder(table):
            return NStepTransitionAdder(client, config.n_step, spec.actions.shape, table=table)

        for j in range(K):  # K single actors, deterministic (sigma 0), 2 episodes each.
            single = adder(f"single_{j}")
            actor = D4PGActor(policy, spec.actions, None, single, sigma=0.0)
            EnvironmentLoop(make[j](), actor).run(num_episodes=2)
            single.flush()
        adders = [adder(f"batched_{j}") for j in range(K)]
        batched = BatchedD4PGActor(policy, spec.actions, None, adders, num_envs=K, sigma=0.0)
        reports = BatchedEnvironmentLoop([m() for m in make], batched).run(num_episodes=2 * K)
        for a in adders:
            a.flush()
        assert sorted(r["env_index"] for r in reports) == sorted(2 * list(range(K)))
        assert all(r["episode_length"] == 100 for r in reports)

        first, actions = [], set()
        for j in range(K):  # Reading a queue empties it: each table is read once.
            want, have = _read_table(client, f"single_{j}"), _read_table(client, f"batched_{j}")
            first.append(want[0].observation)
            actions |= {float(w.action[0]) for w in want}
            assert len(want) == len(have) == 2 * 100
            for w, h in zip(want, have):
                for field in w._fields:
                    a, b = getattr(w, field), getattr(h, field)
                    assert a.shape == b.shape, field
                    np.testing.assert_array_equal(a, b, err_msg=field)
        # The environments really differ (distinct seeds), so routing errors would show.
        assert not np.allclose(first[0], first[1])
        assert actions == {-0.5, 0.5}  # The policy depends on the observation.
    finally:
        server.stop()


def test_batched_actor_noise_and_weight_pulls_by_total_steps():
    config = D4PGConfig.from_overrides({"policy_layers": "16"})
    spec = environments.make_environment_spec(environments.make(TASK, seed=0))
    policy = _policy(config, spec)

    class CountingSource:  # Counts pulls; the real client is exercised by the launch test.
        version, weights = 0, None

        def __init__(self):
            self.pulls = 0

        def update(self, wait=False):
            self.pulls += 1
            return False

    source = CountingSource()
    actor = BatchedD4PGActor(
        policy, spec.actions, source, None, num_envs=4, sigma=0.5, variable_update_period=10
    )
    observations = np.zeros((4,) + spec.observations.shape, np.float32)
    noisy = actor.select_actions(observations)
    clean = policy.batch(observations)
    assert noisy.shape == (4, 1) and np.all(np.abs(noisy) <= 1.0)
    assert len(np.unique(noisy - clean)) == 4  # One independent draw per environment.
    for _ in range(10):  # 40 environment steps: a pull every 10 steps over all four.
        actor.update()
    assert source.pulls == 3  # At 12, 24, 36 steps (each call adds 4).


def test_batched_actor_acts_with_the_weights_it_pulls():
    """Weights published to the "params" table, pulled by the builder's batched actor."""
    config = D4PGConfig.from_overrides(
        {
            "policy_layers": "16,8",
            "sigma": 0.0,  # Deterministic actions: the policy's own.
            "variable_update_period": 6,
            "min_replay_size": 1,
            "samples_per_insert": 0,
        }
    )
    spec = environments.make_environment_spec(environments.make(TASK, seed=0))
    server = builder.make_replay_server(config, spec)
    try:
        client = reverb.Client(f"localhost:{server.port}")
        actor = builder.make_batched_actor(
            config, spec, f"localhost:{server.port}", seed=0, num_envs=K
        )
        nets = networks.make_networks(config, spec)
        observations = np.random.default_rng(0).normal(0, 1, (K,) + spec.observations.shape)
        observations = observations.astype(np.float32)
        versions, want = {}, {}
        for version, seed in ((7, 1), (8, 2)):  # Two weight sets, far from the initialisation.
            rng = np.random.default_rng(seed)
            for v in nets.acting_variables():
                v.assign(rng.normal(0.0, 0.5, v.shape).astype(np.float32))
            versions[version] = [v.numpy() for v in nets.acting_variables()]
            want[version] = nets.policy(nets.torso(tf.constant(observations))).numpy()
        assert not np.allclose(want[7], want[8], atol=1e-2)

        variables.publish(client, 7, versions[7])
        actor.update(wait=True)
        assert actor.weights_version == 7
        np.testing.assert_allclose(actor.select_actions(observations), want[7], atol=1e-5)
        variables.publish(client, 8, versions[8])
        actor.update()  # K = 3 of the 6 steps between pulls: not due.
        assert actor.weights_version == 7
        np.testing.assert_allclose(actor.select_actions(observations), want[7], atol=1e-5)
        actor.update()  # 6 steps: pulls, and acts with the new weights.
        assert actor.weights_version == 8
        np.testing.assert_allclose(actor.select_actions(observations), want[8], atol=1e-5)
    finally:
        server.stop()


def test_long_chunks_write_the_same_items():
    """Actors write 32-step chunks (builder.ACTOR_CHUNK_LENGTH): items must not change."""
    spec = environments.make_environment_spec(environments.make(TASK, seed=0))
    server = reverb.Server(
        [
            reverb.Table.queue(name, max_size=10_000, signature=replay_signature(spec))
            for name in ("default", "long")
        ]
    )
    try:
        client = reverb.Client(f"localhost:{server.port}")
        for table, chunk in (("default", None), ("long", builder.ACTOR_CHUNK_LENGTH)):
            adder = NStepTransitionAdder(client, 5, (1,), table=table, chunk_length=chunk)
            rng = np.random.default_rng(0)
            env = environments.make(TASK, seed=5, action_repeat=10)  # 100-step episodes.
            for _ in range(2):
                timestep = env.reset()
                adder.add_first(timestep)
                while not timestep.last():
                    action = rng.uniform(-1, 1, (1,)).astype(np.float32)
                    timestep = env.step(action)
                    adder.add(action, timestep)
            adder.flush()
        want, have = _read_table(client, "default"), _read_table(client, "long")
        assert len(want) == len(have) == 200
        for w, h in zip(want, have):
            for field in w._fields:
                np.testing.assert_array_equal(getattr(w, field), getattr(h, field), field)
    finally:
        server.stop()
