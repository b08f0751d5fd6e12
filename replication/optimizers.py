"""Sonnet optimizers that average gradients across replicas before updating.

Sonnet 2 optimizers deliberately leave cross-replica gradient aggregation to the
user. The TF-Replicator programming model does it for them: a wrapped optimizer
mean-all-reduces the updates exactly once, then applies the wrapped optimizer's
own rule. With N replicas of per-replica batch B this equals one replica with
batch N*B, which is the guarantee the tests check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager as ContextManager

import sonnet as snt
import tensorflow as tf

from replication.variables import create_in_scope


class ReplicatedOptimizer(snt.Module):
    """Wraps a Sonnet optimizer for use inside `Replicator.run`.

    Args:
      optimizer: a Sonnet optimizer (`snt.optimizers.Adam`, `SGD`, `Momentum`,
        `RMSProp`, ...) constructed inside `Replicator.scope()`.
      scope: the owning Replicator's `scope`, entered to create the optimizer's
        slots so that they are replicated like the parameters.
      synchronous: False for asynchronous parameter-server training, where each
        worker applies its own gradients without waiting for the other workers.
        Gradients are still averaged over the replicas that run in sync: on `ps`
        those are the GPUs of one worker (`num_replicas_in_sync` counts only
        them), so a worker with several GPUs applies one averaged update.

    Context: made in cross-replica context (`Replicator.wrap_optimizer`); `apply` runs in
    replica context; `create_state` in any.
    """

    def __init__(
        self,
        optimizer: snt.Optimizer,
        scope: Callable[[], ContextManager] | None = None,
        synchronous: bool = True,
        name: str | None = None,
    ):
        super().__init__(name=name or f"replicated_{optimizer.name}")
        if isinstance(optimizer, ReplicatedOptimizer):
            raise ValueError(
                "This optimizer is already wrapped; wrapping it twice would average "
                "the gradients twice. Pass the wrapped optimizer as it is."
            )
        self.optimizer = optimizer
        self._scope = scope
        self.synchronous = synchronous
        self._state_created = not hasattr(optimizer, "_initialize")

    @property
    def learning_rate(self):
        """The wrapped optimizer's learning rate (None if it has none). Context: any."""
        return getattr(self.optimizer, "learning_rate", None)

    def apply(self, updates: Sequence[tf.Tensor | None], parameters: Sequence[tf.Variable]) -> None:
        """Averages `updates` across replicas, then applies them to `parameters`.

        Runs in replica context. Parameters whose update is None (unused in the
        loss) are skipped on every replica alike, so collectives stay aligned.
        Gradients are averaged here exactly once: do not all-reduce them in the
        step function as well.
        """
        context = tf.distribute.get_replica_context()
        if context is None:
            raise RuntimeError(
                "ReplicatedOptimizer.apply must be called inside a step function "
                "run by Replicator.run(step_fn, ...)."
            )
        if len(updates) != len(parameters):
            raise ValueError(
                f"Got {len(updates)} updates for {len(parameters)} parameters; "
                "pass one update (gradient) per parameter."
            )
        present = [i for i, update in enumerate(updates) if update is not None]
        if not present:
            raise ValueError("No updates provided for any parameter (all gradients are None).")
        updates = list(updates)
        # On every deployment this spans exactly the replicas that step together:
        # all replicas when synchronous, one worker's local devices on `ps`.
        if context.num_replicas_in_sync > 1:
            reduced = context.all_reduce(tf.distribute.ReduceOp.MEAN, [updates[i] for i in present])
            for i, update in zip(present, reduced):
                updates[i] = update
        if not self._state_created:
            # Sonnet creates optimizer slots lazily on the first apply; inside a
            # replicated tf.function on TF 2.15 that fails ("You must feed a value
            # for placeholder tensor 'cond/else/_1/cond/Placeholder'"). Create them
            # once, eagerly, in the replicator's scope instead.
            self.create_state(parameters)
        # None updates stay in place: Sonnet skips them and keeps its slot list
        # aligned with the parameter list.
        self.optimizer.apply(updates, list(parameters))

    def create_state(self, parameters: Sequence[tf.Variable]) -> None:
        """Creates the optimizer's slots for `parameters` now, in the replicator's scope.

        `apply` does this on its first call; call it yourself when the state must
        exist earlier, e.g. before restoring a checkpoint that holds it. Safe in
        any context; a no-op once the state exists.
        """
        if self._state_created:
            return

        def create() -> None:
            # Sonnet's optimizers expose no public "build"; `_initialize` is the
            # once-only slot constructor every stateful one of them defines.
            self.optimizer._initialize(list(parameters))  # pylint: disable=protected-access

        create_in_scope(create, self._scope)
        self._state_created = True
