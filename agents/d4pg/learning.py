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

import replication
from agents import core
from agents.d4pg import losses, networks, variables
from agents.d4pg.config import D4PGConfig
from agents.d4pg.replay import REPLAY_TABLE

_log = logging.getLogger(__name__)


class Transition(
    collections.namedtuple(
        "Transition", ["observation", "action", "reward", "discount", "next_observation"]
    )
):
    """A batch the update consumes: o_t, a_t, R_t, D_t, o_{t+m} (see `losses.n_step_return`)."""


InputFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]


class ReplayTimeoutError(TimeoutError):
    """No batch could be sampled in time (the rate limiter kept blocking: actors idle)."""


def reverb_input_fn(
    server_address: str, config: D4PGConfig, rate_limiter_timeout_ms: int = -1
) -> InputFn:
    """Per-replica batches of n-step `Transition`s sampled from the "replay" table.

    Each input pipeline opens its own Reverb dataset (so every pipeline samples
    independently); n-step returns and discounts are computed on (padded) batches.

    Args:
      server_address: "host:port" of the replay server.
      config: batch size, n-step discount, prefetching.
      rate_limiter_timeout_ms: -1 waits for data forever; otherwise the dataset ends when
        the rate limiter blocks sampling this long, and `D4PGLearner.step()` raises
        `ReplayTimeoutError` (so a caller can stop a learner that waits for actors).
    """
    discount = float(config.discount)

    def to_transitions(sample: reverb.ReplaySample) -> Transition:
        item = sample.data
        returns, discounts = losses.n_step_return(
            item.rewards, item.discounts, discount, mask=item.discounts >= 0
        )
        return Transition(item.observation, item.action, returns, discounts, item.next_observation)

    def input_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        per_replica = context.get_per_replica_batch_size(config.batch_size)
        dataset = reverb.TrajectoryDataset.from_table_signature(
            server_address=server_address,
            table=REPLAY_TABLE,
            max_in_flight_samples_per_worker=max(
                config.max_in_flight_samples_per_worker, 2 * per_replica
            ),
            rate_limiter_timeout_ms=rate_limiter_timeout_ms,
        )
        # Items shorter than n (episode ends) are padded to the batch's longest; a negative
        # discount marks padding. Batching first and computing returns on whole batches is
        # several times cheaper than a per-item map.
        padding = tf.nest.map_structure(lambda spec: tf.zeros([], spec.dtype), dataset.element_spec)
        padding = padding._replace(data=padding.data._replace(discounts=tf.constant(-1.0)))
        dataset = dataset.padded_batch(per_replica, padding_values=padding, drop_remainder=True)
        dataset = dataset.map(to_transitions)
        return dataset.prefetch(config.prefetch_size)

    return input_fn


class D4PGLearner(core.Learner):
    """Distributional deterministic policy gradients, replicated with `replication`.

    State (all in the checkpoint): online and target networks, the two wrapped Adam
    optimisers (moments, step counts) and the update counter.

    The update of one replica, on its own batch:
      1. every `target_update_period` updates, copy online -> target weights;
      2. critic: distributional TD loss against the projected n-step target
         (`losses.distributional_td_loss`); trains the critic and the torso;
      3. policy: DPG through the critic's mean (`losses.dpg_loss`) on a stop-gradient
         embedding; trains the policy only;
      4. the optimisers average gradients across replicas (once), optionally clip the
         averaged gradients by global norm, and apply them.
    Metrics are reduced across replicas once per update.

    Args:
      config: hyperparameters.
      env_spec: specs of the environment (network shapes).
      replicator: from `replication.make(...)`; the global batch `config.batch_size` is
        split evenly across its replicas.
      input_fn: `input_fn(ctx)` -> dataset of per-replica `Transition` batches (e.g.
        `reverb_input_fn`); tests pass fixed data.
      replay_client: where `publish_variables()` writes weights (None: no publishing).
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
        replicator.per_replica_batch_size(config.batch_size)  # Clear error if not divisible.
        tf.random.set_seed(config.seed)
        with replicator.scope():
            self._online = networks.make_networks(config, env_spec)
            self._target = networks.make_networks(config, env_spec, name_prefix="target_")
            self._policy_optimizer = replicator.wrap_optimizer(
                snt.optimizers.Adam(config.policy_lr)
            )
            self._critic_optimizer = replicator.wrap_optimizer(
                snt.optimizers.Adam(config.critic_lr)
            )
            self._num_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="num_steps")
        self._copy_to_target()
        self._create_optimizer_state()

        self._input_fn = input_fn
        self._iterator = iter(replicator.distribute(input_fn))
        self._train = tf.function(self._train_step)
        # XLA fuses the many small ops of the forward/backward pass (most of the time of a
        # small network's update is per-op overhead); state updates stay outside it.
        self._compute = tf.function(self._loss_and_gradients, jit_compile=config.jit_compile)
        self._steps_since_publish = 0

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
        """Losses and gradients of one replica's batch (pure computation, no state changes)."""
        online, target = self._online, self._target
        with tf.GradientTape(persistent=True) as tape:
            embedding = online.torso(batch.observation)
            next_embedding = tf.stop_gradient(target.torso(batch.next_observation))
            logits = online.critic(embedding, batch.action)
            next_action = target.policy(next_embedding)
            target_logits = target.critic(next_embedding, next_action)
            critic_loss = losses.distributional_td_loss(
                logits, batch.reward, batch.discount, target_logits, online.critic.support
            )

            policy_embedding = tf.stop_gradient(embedding)
            dpg_action = online.policy(policy_embedding)
            q_values = online.critic.mean(online.critic(policy_embedding, dpg_action))
            policy_loss = losses.dpg_loss(q_values)

        critic_grads = tape.gradient(critic_loss, online.critic_variables())
        policy_grads = tape.gradient(policy_loss, online.policy_variables())
        del tape
        metrics = {
            "critic_loss": critic_loss,
            "policy_loss": policy_loss,
            "q_mean": tf.reduce_mean(q_values),
        }
        return critic_grads, policy_grads, metrics

    def _step_fn(self, batch: Transition) -> dict[str, tf.Tensor]:
        """One replica's D4PG update (replica context)."""
        config, online, target = self._config, self._online, self._target

        if self._num_steps % config.target_update_period == 0:
            for source, dest in zip(online.all_variables(), target.all_variables()):
                dest.assign(source)

        critic_grads, policy_grads, metrics = self._compute(batch)
        if config.clipping:
            critic_grads = _clip_mean_gradient(critic_grads, config.max_gradient_norm)
            policy_grads = _clip_mean_gradient(policy_grads, config.max_gradient_norm)
        self._critic_optimizer.apply(critic_grads, online.critic_variables())
        self._policy_optimizer.apply(policy_grads, online.policy_variables())
        self._num_steps.assign_add(1)
        return metrics

    def _train_step(self, iterator) -> dict[str, tf.Tensor]:
        per_replica = self._repl.run(self._step_fn, next(iterator))
        return self._repl.reduce(per_replica, "mean")

    def step(self) -> dict[str, float]:
        """One replicated update (publishing weights every `publish_period` updates).

        Raises:
          ReplayTimeoutError: the input ended, i.e. sampling timed out (only with a
            `rate_limiter_timeout_ms` input); the next call samples again.
        """
        try:
            metrics = self._train(self._iterator)
        except tf.errors.OutOfRangeError:
            self._iterator = iter(self._repl.distribute(self._input_fn))
            raise ReplayTimeoutError(
                "No replay batch within the sampling timeout: the rate limiter is waiting for "
                "actors to insert more (or the replay has fewer than min_replay_size items)."
            ) from None
        self._steps_since_publish += 1
        if self._client is not None and self._steps_since_publish >= self._config.publish_period:
            self.publish_variables()
        return {name: float(value) for name, value in metrics.items()}

    # --------------------------------------------------------------- variables

    @property
    def num_steps(self) -> int:
        """Updates done so far (restored with the checkpoint)."""
        return int(self._num_steps.numpy())

    @property
    def networks(self) -> networks.D4PGNetworks:
        return self._online

    @property
    def target_networks(self) -> networks.D4PGNetworks:
        return self._target

    def get_variables(self, names: Sequence[str]) -> list[list[np.ndarray]]:
        """Groups: "policy" (acting variables, actor order), "critic", "target", "all"."""
        groups = {
            "policy": self._online.acting_variables,
            "critic": self._online.critic_variables,
            "target": self._target.all_variables,
            "all": self._online.all_variables,
        }
        unknown = [n for n in names if n not in groups]
        if unknown:
            raise ValueError(f"Unknown variable group(s) {unknown}; valid: {sorted(groups)}")
        return [[np.asarray(v.numpy()) for v in groups[n]()] for n in names]

    def publish_variables(self) -> None:
        """Writes the acting weights to the "params" table, tagged with `num_steps`."""
        if self._client is None:
            raise RuntimeError(
                "This learner has no replay client to publish to "
                "(construct it with replay_client=reverb.Client(address))."
            )
        (weights,) = self.get_variables(["policy"])
        variables.publish(self._client, self.num_steps, weights)
        self._steps_since_publish = 0

    def reconnect(self, replay_client: reverb.Client | None = None) -> None:
        """Reopens the replay input (and the publishing client) after a replay restart.

        A Reverb dataset iterator does not survive its server; the update function is
        unchanged (the new iterator has the same element spec).
        """
        self._iterator = iter(self._repl.distribute(self._input_fn))
        if replay_client is not None:
            self._client = replay_client

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
        _log.info(
            "Restored learner from %s (step %d)", self._manager.latest_checkpoint, self.num_steps
        )
        if self._client is not None:
            self.publish_variables()
        return True


def _clip_mean_gradient(grads: list[tf.Tensor | None], max_norm: float) -> list:
    """Scales per-replica gradients so that their cross-replica MEAN has norm <= max_norm.

    The optimiser averages gradients across replicas; clipping each replica's gradient
    before that would differ from clipping the gradient of the global batch. Scaling
    every replica's gradient by the same factor min(1, max_norm / |mean|) gives exactly
    the clipped mean after averaging. Costs one extra all-reduce when replicated.
    """
    present = [g for g in grads if g is not None]
    if replication.num_replicas() > 1:
        mean = replication.all_reduce(present, "mean")
    else:
        mean = present
    norm = tf.linalg.global_norm(mean)
    scale = tf.minimum(1.0, max_norm / tf.maximum(norm, 1e-12))
    return [None if g is None else g * scale for g in grads]


def _as_module(nets: networks.D4PGNetworks) -> tf.Module:
    """A trackable holder of one network set, for tf.train.Checkpoint."""
    module = tf.Module()
    module.torso, module.policy, module.critic = nets.torso, nets.policy, nets.critic
    return module
