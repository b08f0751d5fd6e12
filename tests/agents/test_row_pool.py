"""The learner's pool of sampled rows (`row_mixing="pool"`): tf.data's shuffle buffer rule
inside the compiled update.

The swap must give, row for row, what a shuffle buffer gives; every sampled row must be
trained on once; and a learner with the pool must do the same updates whether its K
updates per call are one XLA computation, a graph loop or K calls.
"""

import numpy as np
import pytest
import tensorflow as tf

import replication
from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import D4PGLearner, ReplayTimeoutError, ReverbInput, Transition
from agents.d4pg.row_pool import RowPool
from tests.agents.test_fused_updates import BASE, SPEC, _state, random_transitions

pytestmark = pytest.mark.timeout(300)


def _buffer_rule(pool: list, batch: list, slots: list) -> list:
    """tf.data's shuffle buffer, one row at a time: emit the row at the slot, put the
    next input row there. Changes `pool` in place; returns the emitted rows."""
    out = []
    for row, slot in zip(batch, slots):
        out.append(pool[slot])
        pool[slot] = row
    return out


def _pool(num_rows: int, first_id: int = 0) -> RowPool:
    pool = RowPool(
        {"id": tf.TensorSpec([], tf.int32), "x": tf.TensorSpec([2], tf.float32)}, num_rows
    )
    ids = np.arange(first_id, first_id + num_rows, dtype=np.int32)
    pool.fill({"id": ids, "x": np.stack([ids, -ids], axis=1).astype(np.float32)}, 0)
    return pool


def test_a_swap_emits_what_a_shuffle_buffer_emits_row_by_row():
    """Slots drawn from a pool of 8 for batches of 6 repeat within a batch: a row put in
    earlier in the batch is what a later row at its slot emits."""
    rng = np.random.default_rng(0)
    pool = _pool(8)
    reference = list(range(8))
    next_id, repeats = 8, 0
    for _ in range(50):
        slots = rng.integers(0, 8, size=6)
        repeats += len(slots) - len(set(slots.tolist()))
        ids = np.arange(next_id, next_id + 6, dtype=np.int32)
        next_id += 6
        batch = {"id": ids, "x": np.stack([ids, -ids], axis=1).astype(np.float32)}
        out = pool.swap(batch, tf.constant(slots, tf.int32))
        expected = _buffer_rule(reference, ids.tolist(), slots.tolist())
        assert out["id"].numpy().tolist() == expected
        np.testing.assert_array_equal(
            out["x"].numpy(), np.stack([expected, -np.array(expected)], 1)
        )
    assert repeats > 50  # The batches did reuse slots.


def test_every_row_put_in_comes_out_once():
    """Rows of unique ids through a pool of 64 in batches of 16: what came out plus what
    the pool holds at the end is every id, once (none trained twice, none lost)."""
    rng = np.random.default_rng(1)
    pool = _pool(64)
    seen = []
    for step in range(40):
        ids = np.arange(64 + 16 * step, 64 + 16 * (step + 1), dtype=np.int32)
        batch = {"id": ids, "x": np.zeros((16, 2), np.float32)}
        seen += (
            pool.swap(batch, tf.constant(rng.integers(0, 64, 16), tf.int32))["id"].numpy().tolist()
        )
    held = pool.swap(
        {"id": np.full(64, -1, np.int32), "x": np.zeros((64, 2), np.float32)},
        tf.range(64, dtype=tf.int32),
    )["id"].numpy()
    assert sorted(seen + held.tolist()) == list(range(64 + 16 * 40))


ROWS = 64 * 8  # The input stream: 64 distinct batches of 8 rows, then again.


def _stream(ctx):
    data = random_transitions(ROWS, seed=2)
    return tf.data.Dataset.from_tensor_slices(data).batch(8, drop_remainder=True).repeat()


def _packed(transitions: Transition) -> tf.Tensor:
    """Transitions as rows [o | a | R | D | o'] of width 14: one tensor, as Reverb's items
    of the grouped layout reach a pool learner (`ReverbInput.pooled`)."""
    parts = [tf.reshape(tf.cast(x, tf.float32), [tf.shape(x)[0], -1]) for x in transitions]
    return tf.concat(parts, axis=1)


def _unpacked(rows: tf.Tensor) -> Transition:
    obs, action, reward, discount, next_obs = tf.split(rows, [5, 2, 1, 1, 5], axis=1)
    return Transition(obs, action, reward[:, 0], discount[:, 0], next_obs)


def _packed_stream(ctx, num_batches):
    rows = _stream(ctx).map(_packed)
    return rows if num_batches is None else rows.batch(num_batches, drop_remainder=True)


def _learner(
    updates_per_call: int, fuse: bool = True, pool: bool = True, packed: bool = False
) -> D4PGLearner:
    config = D4PGConfig.from_overrides(
        {
            **BASE,
            "transitions_per_item": 4,
            "row_mixing": "pool",
            "shuffle_buffer_transitions": 96,  # 12 batches of 8; 3 calls of 4 fill it.
            "updates_per_call": updates_per_call,
            "fuse_updates_per_call": fuse,
        }
    )
    # Without the pool: the batches the pool's learner trains on, were the pool to mix
    # nothing (its first 12 batches fill it).
    input_fn = ReverbInput(_stream, config) if pool else (lambda ctx: _stream(ctx).skip(12))
    if packed:  # The pool holds the rows packed; the update unpacks what comes out.
        input_fn = ReverbInput(_stream, config, _packed_stream, _unpacked)
    return D4PGLearner(config, SPEC, replication.make("cpu"), input_fn)


def _start_alike(learners) -> None:
    """Gives every learner the first one's weights (online and target)."""
    first, *rest = learners
    weights = [v.numpy() for v in first.networks.all_variables()]
    for learner in rest:
        for variable, value in zip(learner.networks.all_variables(), weights):
            variable.assign(value)
        learner._copy_to_target()


@pytest.mark.parametrize("fuse", [True, False], ids=["one_xla_computation", "graph_loop"])
def test_a_pool_learner_does_the_same_updates_in_calls_of_four_as_of_one(fuse):
    learners = {
        "four": _learner(4, fuse=fuse),
        "one": _learner(1),
        "no_pool": _learner(1, pool=False),
    }
    _start_alike(learners.values())
    for _ in range(3):
        learners["four"].step()
    for _ in range(12):
        learners["one"].step()
        learners["no_pool"].step()
    assert learners["four"].num_steps == learners["one"].num_steps == 12
    for a, b in zip(_state(learners["four"]), _state(learners["one"])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # The pool changed what was trained on: the same batches unmixed give other weights.
    difference = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(_state(learners["one"]), _state(learners["no_pool"]))
    )
    assert difference > 1e-4


@pytest.mark.parametrize("fuse", [True, False], ids=["one_xla_computation", "graph_loop"])
def test_a_pool_of_packed_rows_unpacked_in_the_update_does_the_same_updates(fuse):
    """An input whose pooled form is packed rows (as `reverb_input_fn`'s grouped items):
    the learner reads that form, K batches stacked when fused, mixes the rows and unpacks
    them in the update: the same updates as a pool of `Transition` fields."""
    learners = {"packed": _learner(4, fuse=fuse, packed=True), "fields": _learner(1)}
    _start_alike(learners.values())
    for _ in range(3):
        learners["packed"].step()
    for _ in range(12):
        learners["fields"].step()
    assert learners["packed"].num_steps == 12
    for a, b in zip(_state(learners["packed"]), _state(learners["fields"])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_an_input_that_ends_while_the_pool_fills_is_a_replay_timeout():
    """A sampling timeout ends the input (`rate_limiter_timeout_ms`): during the fill too,
    `step` raises `ReplayTimeoutError`, which the learner's callers wait on and retry."""
    config = D4PGConfig.from_overrides(
        {**BASE, "transitions_per_item": 4, "row_mixing": "pool", "shuffle_buffer_transitions": 96}
    )
    short = ReverbInput(lambda ctx: _stream(ctx).take(5), config)  # 40 rows of 96.
    learner = D4PGLearner(config, SPEC, replication.make("cpu"), short)
    with pytest.raises(ReplayTimeoutError):
        learner.step()
    assert learner.num_steps == 0
