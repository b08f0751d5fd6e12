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

from agents.d4pg import losses
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


def _expected_items(length: int, episode: int, final_discount: float, n: int, short=False):
    """Hand-written n-step items: (o_t, a_t, r_t.., d_t.., o_{t+m}), m = min(n, T - t).

    With `short`, also Acme's o_0 -> o_m for m = 1 .. min(n, T) - 1.
    """
    rewards = [t + 1 + 100 * episode for t in range(length)]
    discounts = [1.0] * (length - 1) + [final_discount]
    items = []
    for m in range(1, min(n, length)) if short else ():
        items.append(
            dict(
                observation=[0, episode],
                action=[0.0],
                rewards=rewards[:m],
                discounts=discounts[:m],
                next_observation=[m, episode],
            )
        )
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


def _write(client, n, episodes, short=False):
    adder = NStepTransitionAdder(
        client, n_step=n, action_shape=(1,), short_transitions_from_first_state=short
    )
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


@pytest.mark.parametrize("short", [False, True], ids=["ours", "acme_short_first"])
def test_sampled_batches_carry_exact_n_step_returns(short):
    """Adder -> real D4PG replay table -> the learner's input pipeline -> (R_t, D_t)."""
    n, episodes = 3, [(6, 0.0), (2, 1.0)]
    config = D4PGConfig.from_overrides(
        {
            "n_step": n,
            "discount": GAMMA,
            "batch_size": 32,
            "min_replay_size": 1,
            "samples_per_insert": 0,
            "transitions_per_item": 1,  # The one-transition adder's items.
        }
    )
    server = make_replay_server(config, SPEC)
    try:
        address = f"localhost:{server.port}"
        _write(reverb.Client(address), n, episodes, short=short)
        batch = next(iter(reverb_input_fn(address, config)(tf.distribute.InputContext())))
        expected = {}
        for episode, (length, final) in enumerate(episodes):
            for item in _expected_items(length, episode, final, n, short=short):
                ret = sum(GAMMA**k * r for k, r in enumerate(item["rewards"]))
                disc = GAMMA ** len(item["discounts"]) * np.prod(item["discounts"])
                key = (*item["observation"], *item["next_observation"])
                expected[key] = (ret, disc, item["action"])
        assert len(expected) == 6 + 2 + (3 if short else 0)  # T items (+ min(n, T) - 1).
        seen = set()
        for i in range(config.batch_size):
            key = tuple(int(x) for x in [*batch.observation[i], *batch.next_observation[i]])
            ret, disc, action = expected[key]
            seen.add(key)
            assert batch.reward[i].numpy() == pytest.approx(ret, rel=1e-6)
            assert batch.discount[i].numpy() == pytest.approx(disc, rel=1e-6, abs=1e-7)
            np.testing.assert_allclose(batch.action[i].numpy(), action, rtol=1e-6)
        if short:  # 32 uniform draws of 11 items miss all 3 short ones with p = 4e-5.
            assert seen & {(0, 0, 1, 0), (0, 0, 2, 0), (0, 1, 1, 1)}
    finally:
        server.stop()


def _all_items(client, count):
    samples = client.sample(
        REPLAY_TABLE, num_samples=count, emit_timesteps=False, unpack_as_table_signature=True
    )
    return [sample.data for sample in samples]


# Acme's NStepTransitionAdder on one episode (n = 3, gamma 0.9, rewards 1, 2, 3, 4, the
# last step terminal): each transition o_t -> o_{t+m} with its n-step return R and the
# bootstrap discount of the critic target, gamma^m * prod d (Acme stores one gamma less,
# gamma^(m-1) * prod d, and its learner multiplies by gamma). Hand-computed.
ACME_EPISODE = [
    # (t, t + m, R, bootstrap discount)
    (0, 1, 1.0, 0.9),  # The n - 1 short transitions from the first state...
    (0, 2, 1.0 + 0.9 * 2, 0.81),
    (0, 3, 1.0 + 0.9 * 2 + 0.81 * 3, 0.729),  # ...then full ones,
    (1, 4, 2.0 + 0.9 * 3 + 0.81 * 4, 0.0),
    (2, 4, 3.0 + 0.9 * 4, 0.0),  # and the short ones at the end.
    (3, 4, 4.0, 0.0),
]


@pytest.mark.parametrize("short", [False, True], ids=["ours", "acme_short_first"])
def test_short_transitions_from_first_state_are_acmes(short):
    table = reverb.Table.queue(REPLAY_TABLE, max_size=100, signature=replay_signature(SPEC))
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        _write(client, 3, [(4, 0.0)], short=short)
        expected = ACME_EPISODE if short else ACME_EPISODE[2:]
        assert client.server_info()[REPLAY_TABLE].current_size == len(expected)
        got = {}
        for item in _all_items(client, len(expected)):
            start, end = int(item.observation[0]), int(item.next_observation[0])
            returns, discounts = losses.n_step_return(
                item.rewards[None], item.discounts[None], GAMMA
            )
            got[(start, end)] = (
                float(item.action[0]),
                len(item.rewards),
                float(returns[0]),
                float(discounts[0]),
            )
        assert sorted(got) == [(t, end) for t, end, _, _ in expected]
        for t, end, ret, disc in expected:
            action, m, have_ret, have_disc = got[(t, end)]
            assert action == pytest.approx(0.1 * t) and m == end - t
            assert have_ret == pytest.approx(ret, rel=1e-6)
            assert have_disc == pytest.approx(disc, rel=1e-6, abs=1e-7)
    finally:
        server.stop()


@pytest.mark.parametrize(
    "n, episodes",
    [
        (3, [(7, 1.0)]),  # Time limit.
        (3, [(2, 1.0), (4, 0.0)]),  # Shorter than n, then another: min(n, T) - 1 each.
        (5, [(5, 1.0)]),  # Length == n.
        (1, [(3, 1.0)]),  # One-step transitions: nothing shorter exists.
    ],
)
def test_short_transitions_from_first_state_exact_items(n, episodes):
    table = reverb.Table.queue(REPLAY_TABLE, max_size=1000, signature=replay_signature(SPEC))
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        _write(client, n, episodes, short=True)
        expected = [
            item
            for episode, (length, final) in enumerate(episodes)
            for item in _expected_items(length, episode, final, n, short=True)
        ]
        assert len(expected) == sum(t + min(n, t) - 1 for t, _ in episodes)
        assert client.server_info()[REPLAY_TABLE].current_size == len(expected)

        def key(item):
            return (*map(float, item["observation"]), float(item["next_observation"][0]))

        want = {key(item): item for item in expected}
        assert len(want) == len(expected)  # No transition twice.
        for data in _all_items(client, len(expected)):
            have = {name: getattr(data, name).tolist() for name in expected[0]}
            item = want.pop(key(have))
            for name, value in item.items():
                np.testing.assert_allclose(have[name], value, rtol=1e-6, err_msg=name)
        assert not want
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


@pytest.mark.parametrize("short", ["", "short"], ids=["ours", "acme_short_first"])
def test_a_writer_held_back_by_the_rate_limiter_does_not_flood_the_log(short):
    """Reverb warns once 50 items are pending; the adder's bound keeps it below that."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    probe = subprocess.run(
        [sys.executable, "-m", "tests.agents.pending_items_probe", "default", short],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert "wrote 788 steps" in probe.stdout
    assert "alarmingly high" not in probe.stderr
