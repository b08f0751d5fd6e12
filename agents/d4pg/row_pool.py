"""A shuffle buffer inside the learner's compiled update: the pool of sampled rows.

Items of G transitions (`group_adder`) reach the learner as runs of G rows, so a batch of
whole items would hold only B / G items; the rows of many items are mixed before they are
trained on. tf.data's shuffle buffer (`row_mixing="buffer"`) does that in dataset ops paid
per row: about 6 us of learner CPU per transition, which the README command's learner
paid on the same two cores as its update. `RowPool` keeps the buffer's R rows in
variables and mixes in the update itself: each batch of B rows is swapped into the pool
at B random slots, and what those slots held is what the update trains on. That is the
buffer's rule (emit the row at a random slot, put the next input row there), applied row
by row in order, so every sampled row is trained on once after a stay in the pool whose
length is distributed as in the buffer; it costs two gathers and a scatter of B rows.

State: the R rows (plus one scratch row), one replica's own. Not in checkpoints, as
tf.data's buffer is not: a new learner process fills its pool from its input first
(`fill`), as the buffer fills before its first element.
"""

from __future__ import annotations

from typing import Any

import sonnet as snt
import tensorflow as tf


def swap_sources(slots: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Where each output row comes from, and which input rows stay, when B rows are
    swapped into a pool at `slots` one after another.

    Row j of the output is the pool's row at slots[j] after rows 0..j-1 were put in:
    the input row k < j put at the same slot most recently, if any, else the pool's own
    row. Input row j stays in the pool unless a later row takes its slot.

    Args:
      slots: [B] int32 pool slots in [0, R).

    Returns:
      from_batch: [B] bool, output row j is an input row (not the pool's).
      batch_source: [B] int32, that input row's index (0 where from_batch is False).
      displaced: [B] bool, a later input row takes input row j's slot: row j is never in
        the pool (`RowPool.swap` writes it to its scratch row, so that one scatter
        writes each slot once).
    """
    batch = tf.shape(slots)[0]
    index = tf.range(batch)
    same_slot = tf.equal(slots[:, None], slots[None, :])  # [j, k]
    earlier = same_slot & (index[None, :] < index[:, None])
    later = same_slot & (index[None, :] > index[:, None])
    last_earlier = tf.reduce_max(tf.where(earlier, index[None, :], -1), axis=1)
    from_batch = last_earlier >= 0
    batch_source = tf.maximum(last_earlier, 0)
    return from_batch, batch_source, tf.reduce_any(later, axis=1)


class RowPool(snt.Module):
    """R rows of a nest of per-row fields, through which batches are swapped (`swap`).

    Used in replica context by a learner of one replica (its variables are that
    replica's pool). `fill` before the first `swap`: until then the pool holds zeros.

    Example (a learner's update):
      pool = RowPool({"x": tf.TensorSpec([3], tf.float32)}, num_rows=4096)
      pool.fill(first_rows, offset=0)            # R rows, e.g. in parts
      batch = pool.swap(batch, slots)            # slots: [B] int32 in [0, 4096)
    """

    def __init__(self, row_specs: Any, num_rows: int, name: str = "row_pool"):
        super().__init__(name=name)
        if num_rows < 1:
            raise ValueError(f"A row pool needs at least one row, got {num_rows}.")
        self.num_rows = num_rows
        # One row more than R: the scratch row that rows displaced within a batch write to.
        self._rows = tf.nest.map_structure(
            lambda spec: tf.Variable(
                tf.zeros([num_rows + 1, *spec.shape], spec.dtype), trainable=False
            ),
            row_specs,
        )

    def fill(self, rows: Any, offset: int | tf.Tensor) -> None:
        """Writes `rows` (a nest of [n, ...]) to slots offset..offset+n-1."""
        for variable, value in zip(tf.nest.flatten(self._rows), tf.nest.flatten(rows)):
            count = tf.shape(value)[0]
            variable.scatter_update(
                tf.IndexedSlices(value, tf.range(offset, offset + count, dtype=tf.int32))
            )

    def swap(self, batch: Any, slots: tf.Tensor) -> Any:
        """Puts `batch` (a nest of [B, ...]) into the pool at `slots`, row by row; returns
        the rows each slot held when its row was put in (`swap_sources`)."""
        from_batch, batch_source, displaced = swap_sources(slots)
        write_slots = tf.where(displaced, self.num_rows, slots)
        out = []
        for variable, value in zip(tf.nest.flatten(self._rows), tf.nest.flatten(batch)):
            held = tf.gather(variable, slots)
            earlier_input = tf.gather(value, batch_source)
            mask = tf.reshape(from_batch, [-1] + [1] * (len(value.shape) - 1))
            out.append(tf.where(mask, earlier_input, held))
            # The reads above come first: automatic control dependencies order the
            # variable's read and this write as written.
            variable.scatter_update(tf.IndexedSlices(value, write_slots))
        return tf.nest.pack_sequence_as(batch, out)
