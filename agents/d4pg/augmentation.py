"""Random-shift image augmentation of the learner's batches (pixels only).

Each image is padded by `pad` pixels on every side by repeating its edge pixels, then
cropped back to its size at a random offset in [0, 2 * pad] along each axis: a shift of
up to `pad` pixels. This is the augmentation of DrQ (Kostrikov et al., 2020) and RAD
(Laskin et al., 2020), which made pixel actor-critics roughly as sample-efficient as
their feature-based versions on the control suite.

The padding is never materialised: cropping a replicate-padded image at offset o reads
row clip(o - pad + i, 0, H - 1) of the original, so one gather per axis does both.

Offsets come from a stateless generator keyed by (seed, step) and drawn for the whole
GLOBAL batch; a replica takes the rows of its own samples. N replicas with per-replica
batch B therefore shift every sample exactly as one replica with batch N*B does (the
`cpu:2 == cpu` guarantee holds with augmentation on), and a seed reproduces them.
"""

from __future__ import annotations

import tensorflow as tf


def shift_offsets(seed: tf.Tensor, global_batch: int, pad: int) -> tf.Tensor:
    """[global_batch, 2] int32 (row, column) crop offsets in [0, 2 * pad].

    Args:
      seed: shape [2] int32/int64 stateless seed.
      global_batch: samples of the whole update (all replicas).
      pad: the shift bound.
    """
    return tf.random.stateless_uniform(
        [global_batch, 2], seed=seed, minval=0, maxval=2 * pad + 1, dtype=tf.int32
    )


def random_shift(images: tf.Tensor, offsets: tf.Tensor, pad: int) -> tf.Tensor:
    """Shifts each image of [B, H, W, C] by its offsets (edge pixels repeat).

    Args:
      images: [B, H, W, C] (any dtype; uint8 frames stay uint8).
      offsets: [B, 2] int32 crop offsets in [0, 2 * pad] (row, column) into the
        image padded by `pad`; offset `pad` leaves the image unchanged.
      pad: the padding the offsets refer to.

    Returns:
      [B, H, W, C], same dtype.
    """
    height, width = tf.shape(images)[1], tf.shape(images)[2]
    rows = offsets[:, :1] - pad + tf.range(height)[None, :]  # [B, H]
    cols = offsets[:, 1:] - pad + tf.range(width)[None, :]  # [B, W]
    rows = tf.clip_by_value(rows, 0, height - 1)
    cols = tf.clip_by_value(cols, 0, width - 1)
    shifted = tf.gather(images, rows, axis=1, batch_dims=1)
    return tf.gather(shifted, cols, axis=2, batch_dims=1)


def augment_batch_images(
    observation: tf.Tensor,
    next_observation: tf.Tensor,
    *,
    seed: int,
    step: tf.Tensor,
    pad: int,
    global_batch: int,
    first_row: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Independent random shifts of o_t and o_{t+m} for one replica's rows.

    Args:
      observation, next_observation: [B, H, W, C] of this replica.
      seed: the run's seed; step: the update counter (new shifts every update).
      pad: shift bound; global_batch: B times the number of replicas.
      first_row: index of this replica's first sample in the global batch.
    """
    batch = tf.shape(observation)[0]
    step = tf.cast(step, tf.int64)
    shifted = []
    for salt, images in enumerate((observation, next_observation)):
        key = tf.stack([tf.constant(seed, tf.int64), 2 * step + salt])
        offsets = shift_offsets(key, global_batch, pad)
        mine = tf.slice(offsets, tf.stack([tf.cast(first_row, tf.int32), 0]), [batch, 2])
        shifted.append(random_shift(images, mine, pad))
    return shifted[0], shifted[1]
