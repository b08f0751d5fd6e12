"""Items of G whole transitions (`group_adder`), through real Reverb servers.

The grouped layout must hold exactly the transitions of the one-per-item layout, spread
them over the actor's recent past, feed the learner exact n-step returns, and keep the
replay's sizes and rate limiter in transitions.
"""

import contextlib

import numpy as np
import pytest
import reverb
import tensorflow as tf

import replication
from agents.d4pg import builder
from agents.d4pg.config import D4PGConfig
from agents.d4pg.group_adder import NStepGroupAdder, TransitionGroupWriter
from agents.d4pg.learning import D4PGLearner, reverb_input_fn
from agents.d4pg.replay import (
    REPLAY_TABLE,
    GroupedRowLayout,
    make_replay_server,
    replay_signature,
)
from tests.agents.test_adders import GAMMA, SPEC, _episode, _expected_items

pytestmark = pytest.mark.timeout(120)


def _config(**overrides) -> D4PGConfig:
    values = {"discount": GAMMA, "min_replay_size": 1, "samples_per_insert": 0}
    return D4PGConfig.from_overrides({**values, **overrides})


def _writer(client, config, seed=0):
    return TransitionGroupWriter(
        client,
        config.transitions_per_item,
        GroupedRowLayout.of(SPEC, config),
        pool_size=config.item_pool_size,
        seed=seed,
        items_per_write=config.items_per_write,
    )


def _write_episodes(writer, n, episodes, short=False, adders=1):
    """Episode e goes through adder e % adders (adders share the writer)."""
    group_adders = [NStepGroupAdder(writer, n, short) for _ in range(adders)]
    for episode, (length, final_discount) in enumerate(episodes):
        adder = group_adders[episode % adders]
        steps, actions = _episode(length, episode, final_discount)
        adder.add_first(steps[0])
        for action, step in zip(actions, steps[1:]):
            adder.add(action, step)
    writer.write_pending()
    writer.flush()


def _rows(client, config, count):
    """Every transition of the first `count` items of a queue table, row by row."""
    samples = client.sample(
        REPLAY_TABLE, num_samples=count, emit_timesteps=False, unpack_as_table_signature=True
    )
    layout = GroupedRowLayout.of(SPEC, config)
    rows = []
    for sample in samples:
        item = layout.split(np.asarray(sample.data))
        for g in range(config.transitions_per_item):
            kept = item.discounts[g] >= 0  # Padding after m carries discount -1.
            rows.append(
                dict(
                    observation=item.observation[g].tolist(),
                    action=item.action[g].tolist(),
                    rewards=item.rewards[g][kept].tolist(),
                    discounts=item.discounts[g][kept].tolist(),
                    next_observation=item.next_observation[g].tolist(),
                    padding=item.rewards[g][~kept].tolist(),
                )
            )
    return rows


def _key(row):
    return (*row["observation"], *row["next_observation"])


@pytest.mark.parametrize(
    "n, episodes, short",
    [
        (3, [(7, 1.0), (4, 0.0), (2, 1.0), (9, 0.0)], False),
        (3, [(7, 1.0), (4, 0.0), (2, 1.0), (9, 0.0)], True),  # Acme's short first ones.
        (5, [(5, 1.0), (12, 0.0), (3, 0.0)], False),
        (1, [(6, 1.0), (6, 0.0)], False),
    ],
)
def test_items_hold_exactly_the_one_per_item_transitions(n, episodes, short):
    config = _config(n_step=n, transitions_per_item=4, item_pool_size=8)
    table = reverb.Table.queue(REPLAY_TABLE, 1000, signature=replay_signature(SPEC, config))
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        writer = _writer(client, config)
        _write_episodes(writer, n, episodes, short=short, adders=2)
        expected = [
            item
            for episode, (length, final) in enumerate(episodes)
            for item in _expected_items(length, episode, final, n, short=short)
        ]
        items = client.server_info()[REPLAY_TABLE].current_size
        assert items == len(expected) // 4 and writer.pending == len(expected) % 4
        assert writer.transitions_written == 4 * items
        rows = _rows(client, config, items)
        assert all(row.pop("padding") == [0.0] * (n - len(row["rewards"])) for row in rows)
        by_key = {_key(item): item for item in expected}
        assert len(by_key) == len(expected)  # The keys tell transitions apart.
        for row in rows:  # Each written row is one expected transition, exactly.
            item = by_key.pop(_key(row))
            assert row["action"] == pytest.approx(item["action"])
            assert row["rewards"] == pytest.approx(item["rewards"])
            assert row["discounts"] == pytest.approx(item["discounts"])
        assert len(by_key) == writer.pending  # Only what is still pooled is missing.
    finally:
        server.stop()


def test_an_item_draws_its_transitions_from_the_whole_pool():
    """Items are not runs of consecutive steps: their rows span the pool's window."""
    config = _config(n_step=1, transitions_per_item=4, item_pool_size=64)
    table = reverb.Table.queue(REPLAY_TABLE, 1000, signature=replay_signature(SPEC, config))
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        _write_episodes(_writer(client, config, seed=3), 1, [(400, 1.0)])
        items = client.server_info()[REPLAY_TABLE].current_size
        rows = _rows(client, config, items)
        spans = [
            max(r["observation"][0] for r in group) - min(r["observation"][0] for r in group)
            for group in (rows[i : i + 4] for i in range(0, len(rows), 4))
        ]
        # Consecutive steps would span 3; four draws from 64 span ~38 on average.
        assert np.median(spans) > 20
    finally:
        server.stop()


MIXINGS = [(0, "buffer"), (64, "buffer"), (64, "block"), (64, "pool")]
MIXING_IDS = ["whole_items", "shuffle_buffer", "permuted_blocks", "learner_pool"]


@pytest.mark.parametrize("shuffle, mixing", MIXINGS, ids=MIXING_IDS)
def test_learner_batches_are_exact_n_step_transitions_across_replicas(shuffle, mixing):
    """Grouped replay -> the learner's input on 2 replicas -> whole (R_t, D_t) rows."""
    n, episodes = 3, [(9, 0.0), (6, 1.0), (11, 0.0)]
    config = _config(
        n_step=n,
        transitions_per_item=4,
        item_pool_size=8,
        batch_size=16,
        shuffle_buffer_transitions=shuffle,
        row_mixing=mixing,
    )
    server = make_replay_server(config, SPEC)
    try:
        address = f"localhost:{server.port}"
        _write_episodes(_writer(reverb.Client(address), config), n, episodes)
        repl = replication.make("cpu:2")
        per_replica = repl.local_results(
            next(iter(repl.distribute(reverb_input_fn(address, config, env_spec=SPEC))))
        )
        assert len(per_replica) == 2
        for batch in per_replica:
            assert batch.observation.shape == (8, 2)  # 16 / 2 replicas, 2 items of 4.
            _assert_exact_n_step(batch, _expected_transitions(episodes, n))
    finally:
        server.stop()


def _expected_transitions(episodes, n: int) -> dict:
    """(o_t, o_t+m) -> (R_t, D_t, a_t) of every transition `_write_episodes` writes."""
    expected = {}
    for episode, (length, final) in enumerate(episodes):
        for item in _expected_items(length, episode, final, n):
            ret = sum(GAMMA**k * r for k, r in enumerate(item["rewards"]))
            disc = GAMMA ** len(item["discounts"]) * np.prod(item["discounts"])
            expected[_key(item)] = (ret, disc, item["action"])
    return expected


def _assert_exact_n_step(batch, expected: dict) -> None:
    for i in range(batch.observation.shape[0]):
        key = tuple(float(x) for x in [*batch.observation[i], *batch.next_observation[i]])
        ret, disc, action = expected[key]
        assert batch.reward[i].numpy() == pytest.approx(ret, rel=1e-6)
        assert batch.discount[i].numpy() == pytest.approx(disc, rel=1e-6, abs=1e-7)
        np.testing.assert_allclose(batch.action[i].numpy(), action, rtol=1e-6)


def _pool_config(n: int, **overrides) -> D4PGConfig:
    """Items of 4, batches of 16 and a learner pool of 64 rows (`row_mixing="pool"`)."""
    return _config(
        n_step=n,
        transitions_per_item=4,
        item_pool_size=8,
        batch_size=16,
        shuffle_buffer_transitions=64,
        row_mixing="pool",
        **overrides,
    )


@pytest.mark.parametrize("num_batches", [None, 3], ids=["one_batch", "three_stacked"])
def test_pooled_rows_made_transitions_in_the_update_are_exact_n_step_transitions(num_batches):
    """`row_mixing="pool"`: the learner reads the items' rows as sampled, K batches per
    element (`ReverbInput.pooled`), and makes them `Transition`s in its compiled update
    (`from_pooled`, here compiled with XLA as there): exact n-step returns."""
    n, episodes = 3, [(9, 0.0), (6, 1.0), (11, 0.0)]
    config = _pool_config(n)
    width = GroupedRowLayout.of(SPEC, config).width
    server = make_replay_server(config, SPEC)
    try:
        address = f"localhost:{server.port}"
        _write_episodes(_writer(reverb.Client(address), config), n, episodes)
        input_fn = reverb_input_fn(address, config, env_spec=SPEC)
        element = next(iter(input_fn.pooled(num_batches)(tf.distribute.InputContext())))
    finally:
        server.stop()
    assert element.shape == (*([num_batches] if num_batches else []), 16, width)
    batch = tf.function(input_fn.from_pooled, jit_compile=True)(tf.reshape(element, [-1, width]))
    _assert_exact_n_step(batch, _expected_transitions(episodes, n))


@contextlib.contextmanager
def _consecutive_quads(shuffle: int, mixing: str):
    """A replay holding one 400-step episode as items of 4 consecutive steps (pool = G),
    and the config the learner's input reads it with; yields (address, config)."""
    config = _config(
        n_step=1,
        transitions_per_item=4,
        item_pool_size=4,
        batch_size=64,
        shuffle_buffer_transitions=shuffle,
        row_mixing=mixing,
    )
    server = make_replay_server(config, SPEC)
    try:
        address = f"localhost:{server.port}"
        _write_episodes(_writer(reverb.Client(address), config), 1, [(400, 1.0)])
        yield address, config
    finally:
        server.stop()


@pytest.mark.parametrize(
    "shuffle, mixing",
    [(0, "buffer"), (256, "buffer"), (256, "block"), (256, "pool")],
    ids=MIXING_IDS,
)
def test_the_learner_mixes_the_rows_of_many_items_in_a_batch(shuffle, mixing):
    """Items of 4 consecutive steps (pool = G): whole-item batches keep them together.
    With the learner's pool the input is whole items, on one replica (the update mixes
    them: `test_row_pool.py`, and the learner test below)."""
    with _consecutive_quads(shuffle, mixing) as (address, config):
        batch = next(
            iter(reverb_input_fn(address, config, env_spec=SPEC)(tf.distribute.InputContext()))
        )
    steps = batch.observation[:, 0].numpy().reshape(16, 4)  # Aligned quads of rows.
    together = np.mean(steps.max(axis=1) - steps.min(axis=1) == 3)
    whole = shuffle == 0 or mixing == "pool"
    assert together == (1.0 if whole else pytest.approx(0.0, abs=0.2))


def test_with_several_replicas_a_pool_is_mixed_in_the_input_as_the_buffer():
    """A pool is one replica's state: a replica of two gets rows the input mixed."""
    with _consecutive_quads(256, "pool") as (address, config):
        context = tf.distribute.InputContext(num_replicas_in_sync=2)
        batch = next(iter(reverb_input_fn(address, config, env_spec=SPEC)(context)))
    steps = batch.observation[:, 0].numpy().reshape(8, 4)  # 32 rows per replica.
    assert np.mean(steps.max(axis=1) - steps.min(axis=1) == 3) == pytest.approx(0.0, abs=0.2)


@pytest.mark.parametrize("fuse", [True, False], ids=["one_xla_computation", "graph_loop"])
def test_a_learner_pool_holds_sampled_transitions_and_each_update_swaps_rows(fuse):
    """`row_mixing="pool"` on one replica: the first step fills the learner's pool with
    transitions sampled from the replay, and every update puts its batch's rows in."""
    n, episodes = 3, [(30, 0.0), (25, 1.0), (40, 0.0)]
    config = _pool_config(
        n, updates_per_call=2, fuse_updates_per_call=fuse, policy_layers="8", critic_layers="8"
    )
    server = make_replay_server(config, SPEC)
    try:
        address = f"localhost:{server.port}"
        _write_episodes(_writer(reverb.Client(address), config), n, episodes)
        keys = {
            _key(item)
            for episode, (length, final) in enumerate(episodes)
            for item in _expected_items(length, episode, final, n)
        }
        learner = D4PGLearner(
            config, SPEC, replication.make("cpu"), reverb_input_fn(address, config, env_spec=SPEC)
        )

        def pool_rows():
            # The pool holds rows as sampled (`ReverbInput.pooled`): split them here.
            rows = learner._row_pool._rows  # pylint: disable=protected-access
            count = learner._row_pool.num_rows  # pylint: disable=protected-access
            fields = GroupedRowLayout.of(SPEC, config).split(rows[:count].numpy())
            return [
                (*o, *o2)
                for o, o2 in zip(fields.observation.tolist(), fields.next_observation.tolist())
            ]

        learner.step()
        after_one = pool_rows()
        assert len(after_one) == 64 and set(after_one) <= keys
        learner.step()
        after_two = pool_rows()
        assert set(after_two) <= keys
        assert sum(a != b for a, b in zip(after_one, after_two)) >= 16  # Two batches of 16.
    finally:
        server.stop()


def test_a_permuted_block_holds_every_row_of_its_items_once():
    """Block mixing: the batches cut from one block are the rows of its items, each used
    once (items of 4 consecutive steps; a block of 256 rows is 64 items, 4 batches)."""
    with _consecutive_quads(256, "block") as (address, config):
        dataset = reverb_input_fn(address, config, env_spec=SPEC)(tf.distribute.InputContext())
        for block in dataset.batch(4).take(3):
            steps = block.observation[:, :, 0].numpy().ravel()
            items, rows_per_item = np.unique(steps // 4, return_counts=True)
            # An item sampled k times brings its 4 rows k times; none is cut or repeated.
            assert (rows_per_item % 4 == 0).all()
            assert rows_per_item.sum() == 256 and len(items) > 40


def test_replay_sizes_and_rate_limiter_count_transitions():
    config = D4PGConfig.from_overrides(
        {
            "transitions_per_item": 16,
            "batch_size": 64,
            "min_replay_size": 1000,
            "max_replay_size": 100_000,
            "samples_per_insert": 32,
        }
    )
    server = make_replay_server(config, SPEC)
    try:
        info = reverb.Client(f"localhost:{server.port}").server_info()[REPLAY_TABLE]
        assert info.max_size == 100_000 // 16
        limiter = info.rate_limiter_info
        assert limiter.min_size_to_sample == 63  # ceil(1000 / 16) items >= 1000 transitions.
        assert limiter.samples_per_insert == 32.0  # Per item = per transition.
        # The error buffer of 1000 transitions' worth of samples, in items.
        assert limiter.max_diff - limiter.min_diff == pytest.approx(2 * 63 * 32 * 0.1)
    finally:
        server.stop()


def test_a_batched_actor_fills_grouped_replay_from_all_its_environments():
    """The builder's batched actor shares one pool: items mix its environments."""
    import environments
    from agents.environment_loop import BatchedEnvironmentLoop

    config = _config(
        transitions_per_item=8,
        item_pool_size=64,
        batch_size=16,
        policy_layers="8",
        critic_layers="8",
        samples_per_insert=0,
    )
    envs = [builder.make_environment(config, "cartpole:swingup", seed=s) for s in range(4)]
    spec = environments.make_environment_spec(envs[0])
    server = builder.make_replay_server(config, spec)
    try:
        address = f"localhost:{server.port}"
        learner = builder.make_learner(config, spec, address, replication.make("cpu"), None)
        actor = builder.make_batched_actor(config, spec, address, seed=1, num_envs=4)
        BatchedEnvironmentLoop(envs, actor).run(num_episodes=4)
        items = reverb.Client(address).server_info()[REPLAY_TABLE].current_size
        drawn = (4 * 1000 - 64 + 8) // 8  # All but what stays in the pool,
        assert items == drawn - drawn % config.items_per_write  # and what waits for a write.
        learner.step()
        assert learner.num_steps == config.updates_per_call
    finally:
        server.stop()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"transitions_per_item": 3, "batch_size": 64}, "multiple of transitions_per_item"),
        ({"transitions_per_item": 16, "item_pool_size": 8}, "item_pool_size (8) must be >="),
        ({"transitions_per_item": 0}, "transitions_per_item must be >= 1"),
        (
            {"transitions_per_item": 16, "from_pixels": True},
            "pixel runs keep transitions_per_item=1",
        ),
    ],
)
def test_bad_layouts_say_what_to_set(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        D4PGConfig.from_overrides(overrides)


def test_a_replica_batch_of_partial_items_is_refused_before_sampling():
    config = _config(transitions_per_item=32, batch_size=32)
    with pytest.raises(ValueError, match="multiple of transitions_per_item x replicas"):
        builder.make_learner(config, SPEC, "localhost:1", replication.make("cpu:2"), None)


def test_grouped_replay_checkpoint_restores_into_a_new_server(tmp_path):
    config = _config(n_step=3, transitions_per_item=4, item_pool_size=8)
    server = make_replay_server(config, SPEC, checkpoint_dir=str(tmp_path))
    client = reverb.Client(f"localhost:{server.port}")
    _write_episodes(_writer(client, config), 3, [(10, 1.0), (10, 0.0)])
    written = {
        _key(item)
        for e, final in enumerate((1.0, 0.0))
        for item in _expected_items(10, e, final, 3)
    }
    client.checkpoint()
    server.stop()
    restored = make_replay_server(config, SPEC, checkpoint_dir=str(tmp_path))
    try:
        client = reverb.Client(f"localhost:{restored.port}")
        assert client.server_info()[REPLAY_TABLE].current_size == 5  # 20 transitions.
        rows = _rows(client, config, 20)
        assert {_key(row) for row in rows} <= written and len(rows) == 80
    finally:
        restored.stop()


@pytest.mark.parametrize(
    "overrides, replicas, group",
    [
        ({}, 1, 16),  # Features: the default of 16.
        ({"batch_size": 40}, 1, 8),  # The largest divisor of 16 that divides the batch.
        ({}, 8, 8),  # Each of 8 replicas gets 8 transitions of 64.
        ({"batch_size": 66}, 3, 2),
        ({"batch_size": 66}, 4, 1),  # 66 does not split over 4 replicas.
        ({"from_pixels": True}, 1, 1),  # Pixels store each frame once.
        ({"transitions_per_item": 4}, 1, 4),  # A set value wins.
    ],
)
def test_an_unset_layout_resolves_to_whole_items_per_replica(overrides, replicas, group):
    config = D4PGConfig.from_overrides({"batch_size": 64, **overrides})
    assert config.resolved_transitions_per_item(replicas) == group
    assert config.with_pinned_layout(replicas).transitions_per_item == group


def _reference_items(transitions, n, group, pool_size, seed):
    """The items of the pool in plain Python: rows filled in the order they were freed
    (last freed first, row 0 first at the start); when full, G row numbers are drawn
    uniformly and the item is those rows in drawn order; at the end `write_pending` draws
    from the filled rows. Each row is [o | a | r, 0.. | d, -1.. | o'] in float32."""
    rng = np.random.default_rng(seed)
    pool, free, items = [None] * pool_size, list(range(pool_size - 1, -1, -1)), []

    def draw(candidates):
        chosen = rng.choice(candidates, group, replace=False)
        items.append(np.array([pool[c] for c in chosen], np.float32))
        free.extend(int(c) for c in chosen)

    for t in transitions:
        pad = n - len(t["rewards"])
        pool[free.pop()] = (
            t["observation"]
            + t["action"]
            + t["rewards"]
            + [0.0] * pad
            + t["discounts"]
            + [-1.0] * pad
            + t["next_observation"]
        )
        if not free:
            draw(pool_size)
    while pool_size - len(free) >= group:
        filled = np.ones(pool_size, bool)
        filled[free] = False
        draw(np.flatnonzero(filled))
    return items, pool_size - len(free)


@pytest.mark.parametrize("n, short", [(3, False), (3, True), (5, False), (1, False)])
def test_items_are_the_drawn_rows_in_order_with_their_padding(n, short):
    """Each item, byte for byte: which transitions, in which order, padded how."""
    episodes = [(7, 1.0), (4, 0.0), (2, 1.0), (9, 0.0), (12, 1.0)]
    config = _config(n_step=n, transitions_per_item=4, item_pool_size=8)
    table = reverb.Table.queue(REPLAY_TABLE, 1000, signature=replay_signature(SPEC, config))
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        writer = _writer(client, config, seed=5)
        _write_episodes(writer, n, episodes, short=short)
        transitions = [  # In the order one adder emits them (see `NStepGroupAdder.add`).
            item
            for episode, (length, final) in enumerate(episodes)
            for item in _expected_items(length, episode, final, n, short=short)
        ]
        want, left = _reference_items(transitions, n, 4, 8, seed=5)
        assert writer.pending == left and len(want) >= 8
        samples = client.sample(
            REPLAY_TABLE,
            num_samples=len(want),
            emit_timesteps=False,
            unpack_as_table_signature=True,
        )
        have = [np.asarray(sample.data) for sample in samples]  # A queue: in written order.
        assert client.server_info()[REPLAY_TABLE].current_size == 0
        for index, (h, w) in enumerate(zip(have, want, strict=True)):
            assert h.dtype == np.float32 and h.shape == w.shape, index
            np.testing.assert_array_equal(h, w, err_msg=f"item {index}")
    finally:
        server.stop()


def test_items_held_for_one_write_reach_reverb_together_unchanged_and_in_order():
    """`items_per_write` 3: Reverb receives the drawn items three at a time, the rest on
    flush, and they are the items of one write per item, byte for byte, in order."""
    n, episodes = 3, [(7, 1.0), (4, 0.0), (9, 0.0), (12, 1.0)]
    config = _config(n_step=n, transitions_per_item=4, item_pool_size=8, items_per_write=3)
    table = reverb.Table.queue(REPLAY_TABLE, 1000, signature=replay_signature(SPEC, config))
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        writer = _writer(client, config, seed=5)
        adder = NStepGroupAdder(writer, n)
        for episode, (length, final_discount) in enumerate(episodes):
            steps, actions = _episode(length, episode, final_discount)
            adder.add_first(steps[0])
            for action, step in zip(actions, steps[1:]):
                adder.add(action, step)
        transitions = [
            item
            for episode, (length, final) in enumerate(episodes)
            for item in _expected_items(length, episode, final, n)
        ]
        want, _ = _reference_items(transitions, n, 4, 8, seed=5)
        drawn = (len(transitions) - 8) // 4 + 1  # A draw each time the pool of 8 fills.
        assert drawn % 3 and drawn > 3
        writer._writer.flush()  # pylint: disable=protected-access  # Only what was handed over.
        assert client.server_info()[REPLAY_TABLE].current_size == drawn - drawn % 3
        assert writer.held == 4 * (drawn % 3) and writer.transitions_written == 4 * (drawn // 3 * 3)
        writer.write_pending()
        writer.flush()
        assert writer.held == 0 and len(want) > drawn
        samples = client.sample(
            REPLAY_TABLE,
            num_samples=len(want),
            emit_timesteps=False,
            unpack_as_table_signature=True,
        )
        for index, (sample, w) in enumerate(zip(samples, want, strict=True)):
            np.testing.assert_array_equal(np.asarray(sample.data), w, err_msg=f"item {index}")
    finally:
        server.stop()
