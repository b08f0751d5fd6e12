"""The n-step adder against hand-computed items, through a real Reverb server."""

import os
import subprocess
import sys

import dm_env
import numpy as np
import pytest
import reverb
import tensorflow as tf
from dm_env import specs

from agents.d4pg.adders import NStepTransitionAdder
from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import reverb_input_fn
from agents.d4pg.replay import REPLAY_TABLE, make_replay_server, replay_signature
from environments import EnvironmentSpec

pytestmark = pytest.mark.timeout(120)

GAMMA = 0.9
SPEC = EnvironmentSpec(
    observations=specs.Array((2,), np.float32),
    actions=specs.BoundedArray((1,), np.float32, -1.0, 1.0),
    rewards=specs.Array((), np.float32),
    discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
)


def _episode(length: int, episode: int, final_discount: float):
    """Timesteps of one episode: o_t = [t, episode], r_t = t + 1 (+ 100 * episode)."""

    def obs(t):
        return np.array([t, episode], np.float32)

    steps = [dm_env.restart(obs(0))]
    for t in range(length):
        reward = np.float32(t + 1 + 100 * episode)
        if t == length - 1:
            steps.append(
                dm_env.TimeStep(
                    dm_env.StepType.LAST, reward, np.float32(final_discount), obs(t + 1)
                )
            )
        else:
            steps.append(dm_env.transition(reward, obs(t + 1)))
    actions = [np.array([0.1 * t], np.float32) for t in range(length)]
    return steps, actions


def _expected_items(length: int, episode: int, final_discount: float, n: int):
    """Hand-written n-step items: (o_t, a_t, r_t.., d_t.., o_{t+m}), m = min(n, T - t)."""
    rewards = [t + 1 + 100 * episode for t in range(length)]
    discounts = [1.0] * (length - 1) + [final_discount]
    items = []
    for t in range(length):
        m = min(n, length - t)
        items.append(
            dict(
                observation=[t, episode],
                action=[0.1 * t],
                rewards=rewards[t : t + m],
                discounts=discounts[t : t + m],
                next_observation=[t + m, episode],
            )
        )
    return items


def _write(client, n, episodes):
    adder = NStepTransitionAdder(client, n_step=n, action_shape=(1,))
    for episode, (length, final_discount) in enumerate(episodes):
        steps, actions = _episode(length, episode, final_discount)
        adder.add_first(steps[0])
        for action, step in zip(actions, steps[1:]):
            adder.add(action, step)
    adder.flush()
    return adder


@pytest.mark.parametrize(
    "n, episodes",
    [
        (3, [(7, 1.0)]),  # Time limit: last discount 1.
        (3, [(7, 0.0)]),  # Termination: last discount 0.
        (3, [(2, 1.0), (4, 0.0)]),  # An episode shorter than n, then another.
        (5, [(5, 1.0)]),  # Episode length == n.
        (1, [(3, 1.0)]),  # One-step transitions.
    ],
)
def test_items_are_exact_n_step_windows(n, episodes):
    # A FIFO queue with the replay signature returns items exactly in insertion order.
    table = reverb.Table.queue(REPLAY_TABLE, max_size=1000, signature=replay_signature(SPEC))
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        _write(client, n, episodes)
        expected = [
            item
            for episode, (length, final) in enumerate(episodes)
            for item in _expected_items(length, episode, final, n)
        ]
        assert client.server_info()[REPLAY_TABLE].current_size == len(expected)
        samples = client.sample(
            REPLAY_TABLE,
            num_samples=len(expected),
            emit_timesteps=False,
            unpack_as_table_signature=True,
        )
        # Within an episode the adder emits full windows first, then the shorter tail windows
        # (longest first); compare as sets keyed by start observation.
        got = {}
        for sample in samples:
            item = sample.data
            got[tuple(item.observation.tolist())] = dict(
                observation=item.observation.tolist(),
                action=item.action.tolist(),
                rewards=item.rewards.tolist(),
                discounts=item.discounts.tolist(),
                next_observation=item.next_observation.tolist(),
            )
        assert len(got) == len(expected)
        for want in expected:
            have = got[tuple(float(x) for x in want["observation"])]
            for key, value in want.items():
                np.testing.assert_allclose(have[key], value, rtol=1e-6, err_msg=key)
    finally:
        server.stop()


def test_sampled_batches_carry_exact_n_step_returns():
    """Adder -> real D4PG replay table -> the learner's input pipeline -> (R_t, D_t)."""
    n, episodes = 3, [(6, 0.0), (2, 1.0)]
    config = D4PGConfig.from_overrides(
        {
            "n_step": n,
            "discount": GAMMA,
            "batch_size": 32,
            "min_replay_size": 1,
            "samples_per_insert": 0,
        }
    )
    server = make_replay_server(config, SPEC)
    try:
        address = f"localhost:{server.port}"
        _write(reverb.Client(address), n, episodes)
        batch = next(iter(reverb_input_fn(address, config)(tf.distribute.InputContext())))
        expected = {}
        for episode, (length, final) in enumerate(episodes):
            for item in _expected_items(length, episode, final, n):
                ret = sum(GAMMA**k * r for k, r in enumerate(item["rewards"]))
                disc = GAMMA ** len(item["discounts"]) * np.prod(item["discounts"])
                expected[tuple(item["observation"])] = (
                    ret,
                    disc,
                    item["next_observation"],
                    item["action"],
                )
        for i in range(config.batch_size):
            key = tuple(int(x) for x in batch.observation[i].numpy())
            ret, disc, next_obs, action = expected[key]
            assert batch.reward[i].numpy() == pytest.approx(ret, rel=1e-6)
            assert batch.discount[i].numpy() == pytest.approx(disc, rel=1e-6, abs=1e-7)
            np.testing.assert_allclose(batch.next_observation[i].numpy(), next_obs)
            np.testing.assert_allclose(batch.action[i].numpy(), action, rtol=1e-6)
    finally:
        server.stop()


def test_add_first_after_an_unfinished_episode_drops_it():
    table = reverb.Table.queue(REPLAY_TABLE, max_size=100, signature=replay_signature(SPEC))
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        adder = NStepTransitionAdder(client, n_step=2, action_shape=(1,))
        steps, actions = _episode(5, 0, 1.0)
        adder.add_first(steps[0])
        for action, step in zip(actions[:3], steps[1:4]):  # Cut short after 3 steps.
            adder.add(action, step)
        steps, actions = _episode(2, 1, 0.0)
        adder.add_first(steps[0])
        for action, step in zip(actions, steps[1:]):
            adder.add(action, step)
        adder.flush()
        # Episode 0 produced exactly its one complete 2-step window (t=0, seen at t=2)
        # before being cut; its buffered t=1, t=2 create nothing. Episode 1 has two items.
        assert client.server_info()[REPLAY_TABLE].current_size == 3
        # Read everything back through a dataset with a sampling timeout: never blocks,
        # and ends once the queue is empty.
        dataset = reverb.TrajectoryDataset.from_table_signature(
            server_address=f"localhost:{server.port}",
            table=REPLAY_TABLE,
            max_in_flight_samples_per_worker=1,
            rate_limiter_timeout_ms=2000,
        )
        items = [sample.data for sample in dataset]
        assert len(items) == 3
        starts = sorted((int(i.observation[1]), int(i.observation[0])) for i in items)
        assert starts == [(0, 0), (1, 0), (1, 1)]  # (episode, t)
        for item in items:  # Nothing links the two episodes.
            assert item.observation[1] == item.next_observation[1]
    finally:
        server.stop()


def test_a_writer_held_back_by_the_rate_limiter_does_not_flood_the_log():
    """Reverb warns once 50 items are pending; the adder's bound keeps it below that."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    probe = subprocess.run(
        [sys.executable, "-m", "tests.agents.pending_items_probe", "default"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert "wrote 788 steps" in probe.stdout
    assert "alarmingly high" not in probe.stderr
