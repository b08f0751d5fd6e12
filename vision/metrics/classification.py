"""Top-1 / top-5 accuracy as exact integer counts, so replicas and steps add up exactly.

Evaluation batches are padded (mask 0) so every replica gets a full batch; the
counts ignore padding. Summing the counts over replicas and batches, then
dividing once, gives the accuracy over every real example exactly once.
"""

from __future__ import annotations

import tensorflow as tf


def top_k_counts(
    logits: tf.Tensor, labels: tf.Tensor, mask: tf.Tensor, k: int = 5
) -> dict[str, tf.Tensor]:
    """Counts of one batch: {"top1", "top5", "count"} as int32 scalars.

    Args:
      logits: [B, K] class scores.
      labels: [B] int32 true classes.
      mask: [B], > 0 for real examples, 0 for padding.
      k: the "top5" count uses min(k, K) best classes.
    """
    valid = mask > 0
    top1 = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels)
    topk = tf.math.in_top_k(labels, logits, min(k, int(logits.shape[-1])))

    def count(hits):
        return tf.reduce_sum(tf.cast(tf.logical_and(hits, valid), tf.int32))

    return {"top1": count(top1), "top5": count(topk), "count": count(tf.ones_like(valid))}
