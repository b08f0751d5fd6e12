"""D4PG learner: a per-replica update run by the Replicator on its own replay batches."""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable, Sequence

import numpy as np
import reverb
import sonnet as snt
import tensorflow as tf

# Not exported by TF, but what tf.distribute's ClusterCoordinator cancels its blocked
# functions with; TF is pinned (2.15) in pyproject.toml.
from tensorflow.python.eager import cancellation

import replication
from agents import core
from agents.d4pg import augmentation, diagnostics, losses, networks, row_pool, variables
from agents.d4pg.config import D4PGConfig
from agents.d4pg.replay import PARAMS_TABLE, REPLAY_TABLE, GroupedRowLayout, ReplayItem

_log = logging.getLogger(__name__)
# How long a publish may wait for the replay to confirm: a replay that died under the
# learner (at shutdown it stops before the learner's final save) must not hang it.
_PUBLISH_TIMEOUT_MS = 10_000


class Transition(
    collections.namedtuple(
        "Transition", ["observation", "action", "reward", "discount", "next_observation"]
    )
):
    """A batch the update consumes: o_t, a_t, R_t, D_t, o_{t+m} (see `losses.n_step_return`)."""


InputFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]

# Samples a Reverb sampler stream delivers before the client opens a new one (Reverb's
# default: no limit). Sampling is uniform either way; measured on a batch-64 pipeline of
# cartpole items, 256 cut the learner's CPU per batch by about 30% (1.57 against 2.26 ms;
# 64: 1.61, 1024: 2.17) for ~0.05 ms more on the replay server.
SAMPLES_PER_STREAM = 256


class StepCancelledError(RuntimeError):
    """`D4PGLearner.step` was cancelled by `cancel_steps` (the learner is stopping)."""


_CANCELLED = "the update was cancelled by cancel_steps()"


class ReplayTimeoutError(TimeoutError):
    """No batch could be sampled in time (the rate limiter kept blocking: actors idle)."""


def reverb_input_fn(
    server_address: str,
    config: D4PGConfig,
    rate_limiter_timeout_ms: int = -1,
    env_spec=None,
) -> InputFn:
    """Per-replica batches of n-step `Transition`s sampled from the "replay" table.

    Each input pipeline opens its own Reverb dataset (so every pipeline samples
    independently); n-step returns and discounts are computed on (padded) batches, by
    the learner's update for what its pool gives (`ReverbInput.from_pooled`).

    Args:
      server_address: "host:port" of the replay server.
      config: batch size, n-step discount, prefetching.
      rate_limiter_timeout_ms: -1 waits for data forever; otherwise the dataset ends when
        the rate limiter blocks sampling this long, and `D4PGLearner.step()` raises
        `ReplayTimeoutError` (so a caller can stop a learner that waits for actors).
      env_spec: the environment's specs; needed with G > 1 (`resolved_transitions_per_item`),
        whose rows it splits into fields (`replay.GroupedRowLayout`).

    With G = `transitions_per_item` > 1 each replica samples B / G items per batch of B
    transitions (uniformly, as Reverb samples), and their rows pass through a shuffle
    buffer of `config.shuffle_buffer_transitions` before they are batched, or with
    `row_mixing="block"` are permuted a block of that many rows at a time (see
    `D4PGConfig.transitions_per_item` and `row_mixing`). With `row_mixing="pool"` the
    learner mixes the rows itself and reads `ReverbInput.pooled`: the items' rows as
    sampled, K batches per element, split into fields and n-step returns in its compiled
    update (`ReverbInput.from_pooled`), so that the input pipeline does one batch and
    one reshape per K updates on its own thread, not per-row field work.
    """
    discount = float(config.discount)
    layout = None
    if config.resolved_transitions_per_item() > 1:
        if env_spec is None:
            raise ValueError("reverb_input_fn needs env_spec when transitions_per_item > 1")
        layout = GroupedRowLayout.of(env_spec, config)

    def to_transitions(item: ReplayItem) -> Transition:
        returns, discounts = losses.n_step_return(
            item.rewards, item.discounts, discount, mask=item.discounts >= 0
        )
        return Transition(item.observation, item.action, returns, discounts, item.next_observation)

    def input_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        per_replica = context.get_per_replica_batch_size(config.batch_size)
        if config.resolved_transitions_per_item() > 1:
            return _grouped_input(context, per_replica)
        dataset = reverb.TrajectoryDataset.from_table_signature(
            server_address=server_address,
            table=REPLAY_TABLE,
            max_in_flight_samples_per_worker=max(
                config.max_in_flight_samples_per_worker, 2 * per_replica
            ),
            rate_limiter_timeout_ms=rate_limiter_timeout_ms,
            max_samples_per_stream=SAMPLES_PER_STREAM,
        )
        # Items shorter than n (episode ends) are padded to the batch's longest; a negative
        # discount marks padding. Batching first and computing returns on whole batches is
        # several times cheaper than a per-item map.
        padding = tf.nest.map_structure(lambda spec: tf.zeros([], spec.dtype), dataset.element_spec)
        padding = padding._replace(data=padding.data._replace(discounts=tf.constant(-1.0)))
        dataset = dataset.padded_batch(per_replica, padding_values=padding, drop_remainder=True)
        dataset = dataset.map(lambda sample: to_transitions(sample.data))
        return dataset.prefetch(config.prefetch_size)

    def _grouped_items(per_replica: int) -> tf.data.Dataset:
        # Items of G whole transitions (`group_adder`), each one [G, width] tensor of rows
        # (rewards/discounts are [n] parts padded with discount -1): per_replica / G items
        # per batch.
        group = config.resolved_transitions_per_item()
        check_grouped_batch(per_replica, group)
        return reverb.TrajectoryDataset.from_table_signature(
            server_address=server_address,
            table=REPLAY_TABLE,
            max_in_flight_samples_per_worker=max(
                config.max_in_flight_samples_per_worker // group, 2 * per_replica // group
            ),
            rate_limiter_timeout_ms=rate_limiter_timeout_ms,
            max_samples_per_stream=SAMPLES_PER_STREAM,
        )

    def rows_to_transitions(rows: tf.Tensor) -> Transition:
        """[B, width] rows of the grouped layout as a `Transition` batch."""
        return to_transitions(layout.split(rows))

    def pooled_rows(
        context: tf.distribute.InputContext, num_batches: int | None
    ) -> tf.data.Dataset:
        # Whole items' rows, K batches per element: one Reverb batch and one reshape per
        # K updates (`ReverbInput.pooled`).
        per_replica = context.get_per_replica_batch_size(config.batch_size)
        stack = [] if num_batches is None else [num_batches]
        items = (num_batches or 1) * per_replica // config.resolved_transitions_per_item()
        dataset = _grouped_items(per_replica).batch(items, drop_remainder=True)
        dataset = dataset.map(
            lambda sample: tf.reshape(sample.data, [*stack, per_replica, layout.width])
        )
        # The next element is sampled while the update trains on this one.
        return dataset.prefetch(-(-config.prefetch_size // (num_batches or 1)))

    def _grouped_input(context: tf.distribute.InputContext, per_replica: int) -> tf.data.Dataset:
        group = config.resolved_transitions_per_item()
        items_per_batch = per_replica // group
        dataset = _grouped_items(per_replica)
        # With the learner's pool its update mixes the rows (`RowPool`): whole items here.
        mixed_here = config.shuffle_buffer_transitions > 1 and not row_pool_transitions(
            config, context.num_replicas_in_sync
        )
        if mixed_here and config.row_mixing == "block":
            # One element per block of items: their rows permuted together, cut into
            # batches. The same mixing as the buffer without its per-row dataset ops.
            rows = -(-config.shuffle_buffer_transitions // per_replica) * per_replica
            dataset = dataset.batch(rows // group, drop_remainder=True)

            def permuted_batches(sample: reverb.ReplaySample) -> tf.Tensor:
                block = tf.random.shuffle(tf.reshape(sample.data, [rows, layout.width]))
                return tf.reshape(block, [rows // per_replica, per_replica, layout.width])

            # The next block is sampled while this one's batches are used.
            dataset = dataset.map(permuted_batches).prefetch(1).unbatch()
        elif mixed_here:
            # Rows of many items are mixed before they are batched, so a batch holds
            # transitions of ~min(B, buffer / G) items rather than B / G whole items.
            dataset = dataset.map(lambda sample: sample.data).unbatch()
            dataset = dataset.shuffle(config.shuffle_buffer_transitions)
            dataset = dataset.batch(per_replica, drop_remainder=True)
        else:
            dataset = dataset.batch(items_per_batch, drop_remainder=True)
            dataset = dataset.map(lambda sample: sample.data)

        def split(rows: tf.Tensor) -> Transition:
            return rows_to_transitions(tf.reshape(rows, [per_replica, layout.width]))

        return dataset.map(split).prefetch(config.prefetch_size)

    if layout is None:
        return ReverbInput(input_fn, config)
    return ReverbInput(input_fn, config, pooled_rows, rows_to_transitions)


def row_pool_transitions(config: D4PGConfig, num_replicas: int) -> int:
    """Rows the learner's update mixes its batches through (`RowPool`), 0 for none.

    `row_mixing="pool"` with items of G > 1 transitions and one replica in all; with
    several replicas the rows are mixed as with "buffer" (a pool is one replica's state).
    """
    mixing = config.resolved_transitions_per_item() > 1 and config.shuffle_buffer_transitions > 1
    if mixing and config.row_mixing == "pool" and num_replicas == 1:
        return config.shuffle_buffer_transitions
    return 0


class ReverbInput:
    """`reverb_input_fn`'s input function: an `InputFn` of `Transition` batches, which
    also tells the learner whether it must mix the rows of its batches itself
    (`row_pool_transitions`) and, if so, what it reads instead (`pooled`, `from_pooled`).

    Args:
      input_fn: `input_fn(ctx)` -> dataset of per-replica `Transition` batches.
      config: the learner's config (`row_pool_transitions`).
      pooled_fn: `pooled_fn(ctx, K or None)` -> dataset of what the pool holds, K
        batches stacked per element (None: `input_fn`'s batches, stacked by K).
      from_pooled: a pooled batch -> `Transition` (None: they are `Transition`s).
    """

    def __init__(
        self,
        input_fn: InputFn,
        config: D4PGConfig,
        pooled_fn: Callable[[tf.distribute.InputContext, int | None], tf.data.Dataset]
        | None = None,
        from_pooled: Callable[[tf.Tensor], Transition] | None = None,
    ):
        self._input_fn = input_fn
        self._config = config
        self._pooled_fn = pooled_fn
        self._from_pooled = from_pooled

    def __call__(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        return self._input_fn(context)

    def row_pool_transitions(self, num_replicas: int) -> int:
        """Rows of the learner's pool for a learner of `num_replicas` (0: no pool)."""
        return row_pool_transitions(self._config, num_replicas)

    def pooled(self, num_batches: int | None) -> InputFn:
        """The input a learner with a pool reads: batches as its pool holds them, and
        `num_batches` of them per element ([K, B, ...]; None: one, [B, ...])."""
        if self._pooled_fn is None:
            return self if num_batches is None else _stacked(self, num_batches)
        return lambda context: self._pooled_fn(context, num_batches)

    def from_pooled(self, batch) -> Transition:
        """A batch out of the pool as the update's `Transition` (in the update: replica
        context, traced into its compiled computation)."""
        return batch if self._from_pooled is None else self._from_pooled(batch)


def _stacked(input_fn: InputFn, num_batches: int) -> InputFn:
    """`input_fn` whose elements are `num_batches` of its batches stacked ([K, B, ...])."""

    def stacked_input_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return input_fn(context).batch(num_batches, drop_remainder=True).prefetch(1)

    return stacked_input_fn


def check_grouped_batch(per_replica_batch: int, transitions_per_item: int) -> None:
    """Raises ValueError unless a replica's batch is whole items of the grouped layout."""
    if per_replica_batch % transitions_per_item:
        raise ValueError(
            f"Each replica's batch ({per_replica_batch} transitions) must be a multiple of "
            f"transitions_per_item ({transitions_per_item}): set --config.batch_size to a "
            "multiple of transitions_per_item x replicas, or lower transitions_per_item."
        )


class D4PGLearner(core.Learner):
    """Distributional deterministic policy gradients, replicated with `replication`.

    State (all in the checkpoint): online and target networks, the two wrapped Adam
    optimisers (moments, step counts) and the update counter.

    The update of one replica, on its own batch:
      1. every `target_update_period` updates, copy online -> target weights (before
         the update: updates 0, P, 2P, ... start from fresh targets); with
         `target_update_rate` r > 0 instead, copy before update 0 only and, after every
         update's optimiser steps (5), move the targets r of the way to the online weights;
      1b. with a `reverb_input_fn` input of grouped items and `row_mixing="pool"` (one
         replica): the batch's rows, as sampled, go into the learner's pool of sampled
         rows and the rows they displace, split into fields with their n-step returns,
         are the batch (`row_pool`, `ReverbInput.from_pooled`; the first `step` fills
         the pool);
      2. pixels with `random_shift`: shift o_t and o_{t+m} (`augmentation`);
      3. critic: distributional TD loss against the projected n-step target
         (`losses.distributional_td_loss`); trains the critic and the torso;
      4. policy: DPG through the critic's mean on a stop-gradient embedding, with
         dQ/da clipped per sample to L2 norm `dqda_clipping` (Acme), plus
         `policy_preactivation_penalty` on the head's pre-tanh output when set;
         trains the policy;
      5. the optimisers average gradients across replicas (once); with `clipping` the
         averaged gradient of each network is clipped to global norm
         `max_gradient_norm` first; with `lr_decay_updates` Adam's rates for update k
         are the configured ones times 1 - (1 - f) clip((k - s) / (lr_decay_updates - s),
         0, 1), f each network's final scale (`lr_final_scale` unless its own is set),
         s = `lr_decay_start_fraction` x lr_decay_updates (the rates held until then).

    `step()` returns, reduced across replicas: critic_loss, policy_loss (-mean Q),
    q_mean, critic_grad_norm / policy_grad_norm (global norm of the averaged gradient,
    before clipping), critic_clipped / policy_clipped (1 when the global-norm clip
    acted; its mean over updates is the clip fraction), dqda_norm (mean per-sample
    |dQ/da| before its clip), dqda_clip_fraction, policy_saturation (fraction of action
    dimensions whose pre-tanh |x| > 3, where tanh' < 0.01: near 1 for many updates means
    a saturated policy), preactivation_penalty (its loss term, 0 when off), policy_lr and
    critic_lr (with `lr_decay_updates` only: the rates the updates used),
    edge_mass (projected target mass on
    the two edge atoms), beyond_support_mass (target mass clipped onto them),
    n_step_return_max / _min, and every ~100 updates samples_per_insert (sampled /
    inserted items since the last reading, from Reverb's table info; needs a replay
    client). A support that proves too small is reported once with what to set
    (`support_warning`, also logged as a warning).

    Args:
      config: hyperparameters.
      env_spec: specs of the environment (network shapes).
      replicator: from `replication.make(...)`; the global batch `config.batch_size` is
        split evenly across its replicas.
      input_fn: `input_fn(ctx)` -> dataset of per-replica `Transition` batches (e.g.
        `reverb_input_fn`); tests pass fixed data.
      replay_client: where `publish_variables()` writes the acting weights (None: no
        publishing); with `config.act_with_target_policy` these are the target policy's,
        which changes every `target_update_period` updates (every update with
        `target_update_rate`).
      checkpoint_dir: where `save()` / `restore()` keep learner checkpoints.
    """

    def __init__(
        self,
        config: D4PGConfig,
        env_spec,
        replicator: replication.Replicator,
        input_fn: InputFn,
        replay_client: reverb.Client | None = None,
        checkpoint_dir: str | None = None,
        max_checkpoints_to_keep: int = 3,
    ):
        self._config = config
        self._repl = replicator
        self._client = replay_client
        self._publisher: variables.WeightsPublisher | None = None  # Made at the first publish.
        self._readers: dict[str, Callable] = {}  # Compiled reads of variable groups.
        replicator.per_replica_batch_size(config.batch_size)  # Clear error if not divisible.
        tf.random.set_seed(config.seed)
        with replicator.scope():
            self._online = networks.make_networks(config, env_spec)
            self._target = networks.make_networks(config, env_spec, name_prefix="target_")
            # With a decay the rates are variables the update assigns before Adam reads
            # them (`_decay_learning_rates`); without one they stay constants, and the
            # checkpoint holds what it held before the option existed.
            policy_lr, critic_lr = config.policy_lr, config.critic_lr
            if config.lr_decay_updates > 0:
                policy_lr = tf.Variable(policy_lr, trainable=False, name="policy_lr")
                critic_lr = tf.Variable(critic_lr, trainable=False, name="critic_lr")
            self._policy_optimizer = replicator.wrap_optimizer(snt.optimizers.Adam(policy_lr))
            self._critic_optimizer = replicator.wrap_optimizer(snt.optimizers.Adam(critic_lr))
            self._num_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="num_steps")
        # The counter as the last `step` call returned it (None: read the variable). A
        # read of a distributed variable costs ~0.1-0.5 ms, and a launch's learner asks
        # after every call; `step` and `restore` reset it.
        self._known_steps: int | None = None
        self._copy_to_target()
        self._create_optimizer_state()

        self._random_shift = config.resolved_random_shift() and networks.is_pixels(
            env_spec.observations
        )
        vmin, vmax = (float(x) for x in self._online.critic.support.numpy()[[0, -1]])
        self._support_monitor = diagnostics.SupportMonitor(config, vmin, vmax)
        self._replay_ratio = diagnostics.ReplayRatio(replay_client)

        # With one replica and XLA, the `updates_per_call` updates of a call run as one XLA
        # computation (`_fused_updates`) on K batches stacked by the input pipeline. Not
        # for pixels: K stacked image batches are large (~33 MB each at batch 256), and a
        # convolutional update dwarfs the launch cost that fusing saves.
        self._fused = (
            config.jit_compile
            and config.fuse_updates_per_call
            and replicator.num_replicas == 1
            and config.updates_per_call > 1
            and not networks.is_pixels(env_spec.observations)
        )
        # `row_mixing="pool"`: the input's batches are whole items and the update mixes
        # their rows through a pool of rows (`row_pool`), filled by the first `step`;
        # it reads the input's pooled form and makes `Transition`s of what the pool gives.
        self._row_pool: row_pool.RowPool | None = None
        self._row_pool_filled = False
        pool_rows = 0
        if isinstance(input_fn, ReverbInput):
            pool_rows = input_fn.row_pool_transitions(replicator.num_replicas)
        stacked = config.updates_per_call if self._fused else None
        if pool_rows:
            self._input_fn = input_fn.pooled(stacked)
            self._from_pooled = input_fn.from_pooled
        else:
            self._input_fn = input_fn if stacked is None else _stacked(input_fn, stacked)
        self._iterator = iter(replicator.distribute(self._input_fn))
        if pool_rows:
            leading = self._row_pool_leading = 2 if self._fused else 1  # [K, B] or [B].
            element = self._iterator.element_spec
            sizes = tf.nest.flatten(element)[0].shape[:leading]
            if None in sizes:
                raise ValueError(
                    "row_mixing='pool' needs input batches of a static size "
                    "(batch with drop_remainder=True)."
                )
            rows_per_element = int(np.prod(sizes))
            # Filled by whole elements of the input: R rounded up to a multiple of them.
            self._row_pool_elements = -(-pool_rows // rows_per_element)
            # Plain variables, outside the replicator's scope: the one replica's own state
            # (Sonnet's replica-local variables have no scatter_update).
            self._row_pool = row_pool.RowPool(
                tf.nest.map_structure(
                    lambda spec: tf.TensorSpec(spec.shape[leading:], spec.dtype), element
                ),
                num_rows=self._row_pool_elements * rows_per_element,
            )
            self._fill_row_pool_part = tf.function(self._fill_row_pool_from, autograph=False)
        # One cancellation manager per call: TF cancels a call's manager itself when an
        # op of the call fails (e.g. the sampling timeout's end of input).
        self._step_cancellation: cancellation.CancellationManager | None = None
        self._steps_cancelled = False
        # One compiled call runs `updates_per_call` updates: the per-call cost (Python,
        # function dispatch, fetching the metrics) is paid once for all of them. Fused,
        # its Python branches read the config only: traced without autograph, which
        # otherwise converts it and `Replicator.run` (~0.2 CPU-s of every start).
        self._train = tf.function(self._train_step, autograph=not self._fused)
        # XLA fuses the many small ops of the forward/backward pass (most of the time of a
        # small network's update is per-op overhead); state updates stay outside it.
        # Traced without autograph: its Python branches read the config only, and
        # converting the networks' and losses' source cost ~1 CPU-s of every start.
        self._compute = tf.function(
            self._loss_and_gradients, jit_compile=config.jit_compile, autograph=False
        )
        # With one replica there are no collectives, so the whole update (optimisers,
        # target copy, counter) compiles into one XLA computation: a small network's
        # optimiser step is otherwise ~100 separately dispatched ops.
        self._replica_step = self._step_fn
        if config.jit_compile and replicator.num_replicas == 1:
            self._replica_step = tf.function(self._step_fn, jit_compile=True)
        self._fused_step = tf.function(self._fused_updates, jit_compile=True)
        self._published_at = 0  # num_steps at the last publish (see `step`).

        self._checkpoint = tf.train.Checkpoint(
            online=_as_module(self._online),
            target=_as_module(self._target),
            policy_optimizer=self._policy_optimizer,
            critic_optimizer=self._critic_optimizer,
            num_steps=self._num_steps,
        )
        self._manager = None
        if checkpoint_dir is not None:
            self._manager = tf.train.CheckpointManager(
                self._checkpoint,
                directory=os.fspath(checkpoint_dir),
                max_to_keep=max_checkpoints_to_keep,
            )

    # ------------------------------------------------------------------ update

    def _copy_to_target(self) -> None:
        """Target <- online (cross-replica assignment writes every replica's copy)."""
        with self._repl.scope():
            for source, dest in zip(self._online.all_variables(), self._target.all_variables()):
                dest.assign(source)

    def _create_optimizer_state(self) -> None:
        """Creates the Adam moments now rather than at the first update.

        A checkpoint restored into a fresh learner must find every optimiser variable
        (TensorFlow does not defer the restoration of Sonnet's lazily created slot lists).
        """
        for optimizer, params in (
            (self._critic_optimizer, self._online.critic_variables()),
            (self._policy_optimizer, self._online.policy_variables()),
        ):
            optimizer.create_state(params)

    def _loss_and_gradients(self, batch: Transition):
        """Losses, gradients and diagnostics of one replica's batch (no state changes)."""
        config, online, target = self._config, self._online, self._target
        support = online.critic.support

        # Target distribution: target torso, policy and critic at o_{t+m}; no gradient.
        next_embedding = target.torso(batch.next_observation)
        target_logits = target.critic(next_embedding, target.policy(next_embedding))
        projected = losses.categorical_target(batch.reward, batch.discount, target_logits, support)

        # Critic (and torso): cross-entropy to the projected target.
        with tf.GradientTape() as critic_tape:
            embedding = online.torso(batch.observation)
            logits = online.critic(embedding, batch.action)
            critic_loss = losses.cross_entropy(logits, projected)
        critic_grads = critic_tape.gradient(critic_loss, online.critic_variables())

        # Policy: DPG through the critic's mean on a stop-gradient embedding, with the
        # per-sample dQ/da clipped (Acme), i.e. grad = -mean_b clip(dQ/da_b) da_b/dtheta.
        policy_embedding = tf.stop_gradient(embedding)
        with tf.GradientTape() as policy_tape:
            preactivation = online.policy.preactivation(policy_embedding)
            dpg_action = online.policy.squash(preactivation)
            penalty = tf.constant(0.0)
            if config.policy_preactivation_penalty > 0:
                penalty = losses.preactivation_penalty(
                    preactivation, config.policy_preactivation_penalty
                )
        with tf.GradientTape() as action_tape:
            action_tape.watch(dpg_action)
            q_values = online.critic.mean(online.critic(policy_embedding, dpg_action))
        # q_b depends on a_b only, so the gradient of sum_b q_b is each sample's dQ/da.
        dqda = action_tape.gradient(q_values, dpg_action)
        dqda_norm = tf.reduce_mean(tf.norm(dqda, axis=-1))
        dqda_clip_fraction = tf.constant(0.0)
        if config.dqda_clipping > 0:
            dqda, dqda_clip_fraction = losses.clip_dqda(dqda, config.dqda_clipping)
        batch_size = tf.cast(tf.shape(q_values)[0], tf.float32)
        # The DPG enters as an output gradient (clipped dQ/da), the penalty as a loss.
        targets, output_gradients = [dpg_action], [-dqda / batch_size]
        if config.policy_preactivation_penalty > 0:
            targets.append(penalty)
            output_gradients.append(tf.ones_like(penalty))
        policy_grads = policy_tape.gradient(
            targets, online.policy_variables(), output_gradients=output_gradients
        )
        policy_loss = losses.dpg_loss(q_values)

        metrics = {
            "critic_loss": critic_loss,
            "policy_loss": policy_loss,
            "q_mean": tf.reduce_mean(q_values),
            "dqda_norm": dqda_norm,
            "dqda_clip_fraction": dqda_clip_fraction,
            "policy_saturation": losses.saturated_fraction(preactivation),
            "preactivation_penalty": penalty,
            **losses.support_diagnostics(
                batch.reward, batch.discount, target_logits, projected, support
            ),
        }
        return critic_grads, policy_grads, metrics

    def _augment(self, batch: Transition) -> Transition:
        """Random shifts of this replica's images (`augmentation`), keyed by seed and step."""
        per_replica = tf.shape(batch.observation)[0]
        observation, next_observation = augmentation.augment_batch_images(
            batch.observation,
            batch.next_observation,
            seed=self._config.seed,
            step=self._num_steps,
            pad=self._config.random_shift_pad,
            global_batch=self._config.batch_size,
            first_row=replication.replica_id() * per_replica,
        )
        return batch._replace(observation=observation, next_observation=next_observation)

    def _step_fn(self, batch: Transition) -> dict[str, tf.Tensor]:
        """One replica's D4PG update (replica context)."""
        config, online, target = self._config, self._online, self._target

        soft_targets = config.target_update_rate > 0
        if soft_targets:
            copy_targets = self._num_steps == 0  # Polyak averaging starts from a copy.
        else:
            copy_targets = self._num_steps % config.target_update_period == 0
        if copy_targets:
            for source, dest in zip(online.all_variables(), target.all_variables()):
                dest.assign(source)

        if self._row_pool is not None:
            batch = self._from_pooled(self._mix_rows(batch))
        if self._random_shift:
            batch = self._augment(batch)
        # With a decay, the rates this update uses (reported with its metrics).
        rates = self._decay_learning_rates() if config.lr_decay_updates > 0 else {}
        critic_grads, policy_grads, metrics = self._compute(batch)
        critic_norm = _mean_gradient_norm(critic_grads)
        policy_norm = _mean_gradient_norm(policy_grads)
        if config.clipping:
            critic_grads = _scale_to_norm(critic_grads, critic_norm, config.max_gradient_norm)
            policy_grads = _scale_to_norm(policy_grads, policy_norm, config.max_gradient_norm)
        self._critic_optimizer.apply(critic_grads, online.critic_variables())
        self._policy_optimizer.apply(policy_grads, online.policy_variables())
        if soft_targets:  # After the optimisers: the targets follow the updated weights.
            rate = config.target_update_rate
            for source, dest in zip(online.all_variables(), target.all_variables()):
                dest.assign_add(rate * (source - dest))
        # Automatic control dependencies order stateful ops per resource only: without
        # this, a sample that times out (the iterator ends) could still bump the counter.
        with tf.control_dependencies([critic_norm, policy_norm]):
            self._num_steps.assign_add(1)

        clip = float(config.max_gradient_norm) if config.clipping else float("inf")
        returns = tf.stack([tf.reduce_max(batch.reward), -tf.reduce_min(batch.reward)])
        if replication.num_replicas() > 1:  # The metrics' mean then keeps the extremes.
            returns = replication.all_reduce(returns, "max")
        return {
            **metrics,
            **rates,
            "critic_grad_norm": critic_norm,
            "policy_grad_norm": policy_norm,
            "critic_clipped": tf.cast(critic_norm > clip, tf.float32),
            "policy_clipped": tf.cast(policy_norm > clip, tf.float32),
            "n_step_return_max": returns[0],
            "n_step_return_min": -returns[1],
        }

    def _mix_rows(self, batch):
        """This update's batch, as the pool holds it: the rows its own rows displace from
        the pool, at slots drawn from the seed and the update counter (replica context,
        one replica)."""
        pool = self._row_pool
        seed = tf.stack([tf.constant(self._config.seed, tf.int64), self._num_steps])
        rows = tf.nest.flatten(batch)[0].shape[0]
        slots = tf.random.stateless_uniform(
            [rows], seed, minval=0, maxval=pool.num_rows, dtype=tf.int32
        )
        return pool.swap(batch, slots)

    def _fill_row_pool_rows(self, element: Transition, offset: tf.Tensor) -> None:
        """Writes one input element's rows to the pool from `offset` (replica context)."""
        leading = self._row_pool_leading
        rows = tf.nest.map_structure(lambda x: tf.reshape(x, [-1, *x.shape[leading:]]), element)
        self._row_pool.fill(rows, offset)

    def _fill_row_pool_from(self, iterator, offset: tf.Tensor) -> None:
        """Takes one input element into the pool from `offset`. Compiled, like the update,
        so that `cancel_steps` reaches a fill waiting on the replay and the input's end is
        the same `OutOfRangeError`."""
        self._repl.run(self._fill_row_pool_rows, next(iterator), offset)

    def _fill_row_pool(self) -> None:
        """Fills the pool from the input before the first update, as tf.data's shuffle
        buffer fills before its first element: those rows are sampled, not yet trained."""
        rows_per_element = self._row_pool.num_rows // self._row_pool_elements
        for part in range(self._row_pool_elements):
            offset = tf.constant(part * rows_per_element, tf.int32)
            self._fill_row_pool_part(self._iterator, offset)
        self._row_pool_filled = True

    def _decay_learning_rates(self) -> dict[str, tf.Tensor]:
        """Sets both Adam rates for the update `num_steps` (replica context): the
        configured rates until update s = `lr_decay_start_fraction` x `lr_decay_updates`,
        then linear to their final scale (`final_lr_scales`) times them at update
        `lr_decay_updates`, constant after (`D4PGConfig.decay_window` and `decayed`, the
        rules the actors' sigma follows too). Every replica assigns the same value.
        Returns the two rates as `policy_lr` and `critic_lr`, and with
        `sigma_final_scale` < 1 the actors' exploration sigma for weights of this step
        (`D4PGConfig.sigma_at`, on the same schedule) as `exploration_sigma`."""
        config = self._config
        start, end = config.decay_window()
        progress = tf.clip_by_value(
            (tf.cast(self._num_steps, tf.float32) - start) / (end - start), 0.0, 1.0
        )
        policy_final, critic_final = config.final_lr_scales()
        rates = {
            "policy_lr": config.decayed(config.policy_lr, policy_final, progress),
            "critic_lr": config.decayed(config.critic_lr, critic_final, progress),
        }
        self._policy_optimizer.learning_rate.assign(rates["policy_lr"])
        self._critic_optimizer.learning_rate.assign(rates["critic_lr"])
        if config.sigma_final_scale != 1.0:  # Reported only: the actors set their own.
            rates["exploration_sigma"] = config.decayed(
                config.sigma, config.sigma_final_scale, progress
            )
        return rates

    def _fused_updates(self, batches: Transition) -> dict[str, tf.Tensor]:
        """`updates_per_call` updates of one replica on K stacked batches ([K, B, ...]), in
        one XLA computation: the mean of their metrics (replica context, one replica).

        The same updates as K calls of `_step_fn`, without K launches of a compiled
        computation and the executor's work between them.
        """
        num_updates = self._config.updates_per_call
        # One trace of `_step_fn` is both the loop's body and where the sums' zeros get
        # their shapes: the loop then holds the computation's only copy of the update.
        # Starting from a first update outside the loop (the loop's initial values) put
        # two copies in it, and XLA's compile time doubled with them; tracing the body
        # a second time for the shapes cost ~0.7 CPU-s of every start.
        first = tf.nest.map_structure(lambda x: tf.TensorSpec(x.shape[1:], x.dtype), batches)
        update = tf.function(self._step_fn).get_concrete_function(first)
        shapes = update.structured_outputs
        metrics = {name: tf.zeros(value.shape, value.dtype) for name, value in shapes.items()}
        for i in tf.range(num_updates):
            more = update(tf.nest.map_structure(lambda x, i=i: x[i], batches))
            metrics = {name: metrics[name] + more[name] for name in metrics}
        return {name: value / num_updates for name, value in metrics.items()}

    def _train_step(self, iterator) -> tuple[dict[str, tf.Tensor], tf.Tensor, list[tf.Tensor]]:
        """`updates_per_call` updates, each on its own batch: the mean of their metrics,
        the update counter after them and the acting weights after them (what
        `acting_weights` would read: `step` publishes them without another call).

        Fused (`fuse_updates_per_call`): one XLA computation on K stacked batches
        (`_fused_updates`). Otherwise the updates after the first run in a
        `tf.while_loop` (not unrolled: the graph and its compile time do not grow with K). Each update is exactly `_step_fn` as in a
        call of one update: the counter it reads for the target copy was incremented by
        the previous update, so targets are copied on the same update numbers. The counter
        is returned because reading the variable from Python costs ~0.3 ms each time,
        which `step` paid two to four times per call.
        """
        num_updates = self._config.updates_per_call
        if self._fused:
            metrics = self._repl.reduce(self._repl.run(self._fused_step, next(iterator)), "mean")
        else:
            metrics = self._repl.reduce(self._repl.run(self._replica_step, next(iterator)), "mean")
            if num_updates > 1:
                for _ in tf.range(num_updates - 1):
                    more = self._repl.reduce(
                        self._repl.run(self._replica_step, next(iterator)), "mean"
                    )
                    metrics = {name: metrics[name] + more[name] for name in metrics}
                metrics = {name: value / num_updates for name, value in metrics.items()}
        # Returned, not read afterwards: a compiled read of the group is a second call
        # (~0.2 ms), which publishing after nearly every call paid.
        weights = []
        if self._client is not None:
            weights = [tf.identity(v) for v in self._acting_variables()]
        return metrics, self._num_steps.read_value(), weights

    def step(self) -> dict[str, float]:
        """`config.updates_per_call` replicated updates in one compiled call.

        Returns the mean of the updates' metrics. Weights are published when the update
        counter crosses a multiple of `publish_period` during the call (one update per
        call: every `publish_period` updates, when `num_steps` reaches each multiple).

        Raises:
          ReplayTimeoutError: the input ended, i.e. sampling timed out (only with a
            `rate_limiter_timeout_ms` input); the next call samples again. Updates done
            are kept (`num_steps` counts them): none of the call with
            `fuse_updates_per_call`, which samples its K batches first, else those
            before the timeout.
          StepCancelledError: `cancel_steps` was called, before or during this step.
        """
        manager = self._step_cancellation = cancellation.CancellationManager()
        # Unknown until this call returns its counter: a call that raises may have done
        # some updates (not with `fuse_updates_per_call`), which a read then counts.
        self._known_steps = None
        if self._steps_cancelled:  # Also when `cancel_steps` ran just before the line above.
            raise StepCancelledError(_CANCELLED)
        try:
            with cancellation.CancellationManagerContext(manager):
                if self._row_pool is not None and not self._row_pool_filled:
                    self._fill_row_pool()
                metrics, counter, weights = self._train(self._iterator)
        except tf.errors.CancelledError:
            if not self._steps_cancelled:
                raise
            raise StepCancelledError(_CANCELLED) from None
        except tf.errors.OutOfRangeError:
            self._iterator = iter(self._repl.distribute(self._input_fn))
            raise ReplayTimeoutError(
                "No replay batch within the sampling timeout: the rate limiter is waiting for "
                "actors to insert more (or the replay has fewer than min_replay_size items)."
            ) from None
        steps = self._known_steps = int(counter)
        period = self._config.publish_period
        if self._client is not None and steps // period > self._published_at // period:
            self._publish([w.numpy() for w in weights], steps, wait=False)
        result = {name: float(value) for name, value in metrics.items()}
        self._support_monitor.observe(result)
        spi = self._replay_ratio.update(steps)
        if spi is not None:
            result["samples_per_insert"] = spi
        return result

    def cancel_steps(self) -> None:
        """Cancels the step in flight, if any, and every later one; callable from any thread.

        A step waits in its input for as long as the replay does not answer: Reverb's
        sampler retries an unreachable server for ever (a replay that stopped first, was
        killed or is frozen), and no rate-limiter timeout fires without an answer. A
        process that must save when it stops calls this from another thread; the step
        then raises `StepCancelledError`. What the step did is whole updates only (each
        update's writes wait for its batch), so a checkpoint saved afterwards is one the
        learner could have saved between two updates.
        """
        self._steps_cancelled = True
        manager = self._step_cancellation
        if manager is not None:
            manager.start_cancel()

    @property
    def support_warning(self) -> str | None:
        """The warning logged once when the value support proved too small (else None)."""
        return self._support_monitor.warning

    # --------------------------------------------------------------- variables

    @property
    def num_steps(self) -> int:
        """Updates done so far (restored with the checkpoint)."""
        if self._known_steps is not None:
            return self._known_steps
        return int(self._num_steps.numpy())

    @property
    def networks(self) -> networks.D4PGNetworks:
        return self._online

    @property
    def target_networks(self) -> networks.D4PGNetworks:
        return self._target

    def get_variables(self, names: Sequence[str]) -> list[list[np.ndarray]]:
        """Groups: "policy" and "target_policy" (online / target torso and policy, in
        actor order), "critic", "target" (every target variable), "all" (online)."""
        groups = self._variable_groups()
        unknown = [n for n in names if n not in groups]
        if unknown:
            raise ValueError(f"Unknown variable group(s) {unknown}; valid: {sorted(groups)}")
        for name in names:
            if name not in self._readers:
                # One compiled read per group: `.numpy()` on each distributed variable
                # costs ~100 us apiece, which publishing every call of the update paid.
                self._readers[name] = tf.function(
                    lambda read=groups[name]: [tf.identity(v) for v in read()]
                )
        return [[t.numpy() for t in self._readers[n]()] for n in names]

    def acting_weights(self) -> list[np.ndarray]:
        """The policy actors, the evaluator and snapshots use, in actor order: the target
        torso and policy with `config.act_with_target_policy` (Acme), else the online ones."""
        return self.get_variables([self._acting_group()])[0]

    def _variable_groups(self) -> dict[str, Callable[[], list[tf.Variable]]]:
        """The groups `get_variables` reads, by name."""
        return {
            "policy": self._online.acting_variables,
            "target_policy": self._target.acting_variables,
            "critic": self._online.critic_variables,
            "target": self._target.all_variables,
            "all": self._online.all_variables,
        }

    def _acting_group(self) -> str:
        """The group actors act with (see `acting_weights`)."""
        return "target_policy" if self._config.act_with_target_policy else "policy"

    def _acting_variables(self) -> list[tf.Variable]:
        """The variables of `acting_weights` (read in the compiled call: `_train_step`)."""
        return self._variable_groups()[self._acting_group()]()

    def publish_variables(self, wait: bool = True, step: int | None = None) -> None:
        """Writes `acting_weights()` to the "params" table, tagged with `num_steps`.

        Returns once they are stored, or with `wait=False` (the periodic publishing of
        `step`) once the previous publish is: the newest may still be on its way. `step`,
        when given, is `num_steps` as the caller already knows it (saves reading it).
        """
        if self._client is None:
            raise RuntimeError(
                "This learner has no replay client to publish to "
                "(construct it with replay_client=reverb.Client(address))."
            )
        step = self.num_steps if step is None else step
        self._publish(self.acting_weights(), step, wait=wait)

    def _publish(self, weights: list[np.ndarray], step: int, wait: bool) -> None:
        if self._publisher is None:
            self._publisher = variables.WeightsPublisher(
                self._client, timeout_ms=_PUBLISH_TIMEOUT_MS
            )
        self._publisher.publish(step, weights, wait=wait)
        self._published_at = step

    def wait_for_publish(self) -> None:
        """Returns once the weights published so far are stored in the replay: `step`
        publishes without waiting for the newest to arrive (see `publish_variables`)."""
        if self._publisher is not None:
            self._publisher.wait()

    def republish_if_missing(self, timeout_s: int = 5) -> bool:
        """Publishes again when the "params" table is empty; returns whether it did.

        A replay that restarted without a checkpoint (or from one written before the
        first publish) comes back with no weights, and a learner waiting for
        `min_replay_size` would not publish until actors refill it: a restarted actor
        would wait for weights meanwhile. Call it while `step` times out.
        """
        if self._client is None:
            return False
        info = self._client.server_info(timeout=timeout_s)
        if int(info[PARAMS_TABLE].current_size) > 0:
            return False
        self._publisher = None  # Its writer may belong to the server that went away.
        self.publish_variables()
        return True

    def reconnect(self, replay_client: reverb.Client | None = None) -> None:
        """Reopens the replay input (and the publishing client) after a replay restart.

        A Reverb dataset iterator does not survive its server; the update function is
        unchanged (the new iterator has the same element spec).
        """
        self._iterator = iter(self._repl.distribute(self._input_fn))
        if replay_client is not None:
            self._client = replay_client
            self._publisher = None  # Its writer belonged to the old connection.

    def optimizer_state(self) -> list[np.ndarray]:
        """All optimiser variables (moments and step counts) as numpy, for tests/inspection."""
        return [
            np.asarray(v.numpy())
            for opt in (self._critic_optimizer, self._policy_optimizer)
            for v in opt.variables
        ]

    # ------------------------------------------------------------- checkpoints

    def save(self) -> str | None:
        """Writes a checkpoint (networks, targets, optimisers, step); returns its path."""
        if self._manager is None:
            return None
        return self._manager.save(checkpoint_number=self.num_steps)

    def restore(self) -> bool:
        """Restores the latest checkpoint if there is one; returns whether it did.

        After a restore the restored weights are published (when a replay client is set),
        so actors do not keep acting with the fresh initialisation.
        """
        if self._manager is None or self._manager.latest_checkpoint is None:
            return False
        self._checkpoint.restore(self._manager.latest_checkpoint).assert_existing_objects_matched()
        self._known_steps = None
        _log.info(
            "Restored learner from %s (step %d)", self._manager.latest_checkpoint, self.num_steps
        )
        if self._client is not None:
            self.publish_variables()
        return True


def _mean_gradient_norm(grads: list[tf.Tensor | None]) -> tf.Tensor:
    """Global norm of the cross-replica MEAN of per-replica gradients (before clipping).

    Costs one extra all-reduce when replicated (the optimiser averages again).
    """
    present = [g for g in grads if g is not None]
    if replication.num_replicas() > 1:
        present = replication.all_reduce(present, "mean")
    return tf.linalg.global_norm(present)


def _scale_to_norm(grads: list[tf.Tensor | None], norm: tf.Tensor, max_norm: float) -> list:
    """Scales per-replica gradients so that their cross-replica MEAN has norm <= max_norm.

    The optimiser averages gradients across replicas; clipping each replica's gradient
    before that would differ from clipping the gradient of the global batch. Scaling
    every replica's gradient by the same factor min(1, max_norm / |mean|) gives exactly
    the clipped mean after averaging.
    """
    scale = tf.minimum(1.0, max_norm / tf.maximum(norm, 1e-12))
    return [None if g is None else g * scale for g in grads]


def _as_module(nets: networks.D4PGNetworks) -> tf.Module:
    """A trackable holder of one network set, for tf.train.Checkpoint."""
    module = tf.Module()
    module.torso, module.policy, module.critic = nets.torso, nets.policy, nets.critic
    return module
