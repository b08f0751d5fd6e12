"""Creating variables safely from inside a replicated step.

Sonnet creates much of its state lazily, on first use: optimizer slots, moving
averages, spectral-norm vectors. When that first use is inside a replicated
`tf.function`, each replica thread traces the creation and TF 2.15 either fails
("You must feed a value for placeholder tensor ...") or creates the variable from
one replica's graph tensor. `create_in_scope` instead steps out to cross-replica
context (merge_call), then out of the function graph (init_scope), re-enters the
owning Replicator's variable scope and creates the state there, once, eagerly.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import TypeVar

import tensorflow as tf

T = TypeVar("T")

# strategy -> weak reference to the `scope` method of the Replicator owning it
# (weak, so neither keeps the other alive).
_SCOPES: weakref.WeakKeyDictionary[tf.distribute.Strategy, weakref.WeakMethod] = (
    weakref.WeakKeyDictionary()
)


def register_scope(strategy: tf.distribute.Strategy, scope: Callable[[], ContextManager]) -> None:
    """Records how to enter the variable scope of the Replicator owning `strategy`."""
    _SCOPES[strategy] = weakref.WeakMethod(scope)


def _scope_for(strategy: tf.distribute.Strategy | None) -> ContextManager:
    if strategy is None:
        return contextlib.nullcontext()
    method = _SCOPES.get(strategy)
    scope = method() if method is not None else None
    return scope() if scope is not None else strategy.scope()


def create_in_scope(
    create: Callable[[], T], scope: Callable[[], ContextManager] | None = None
) -> T:
    """Runs `create()` eagerly in a Replicator's variable scope and returns its result.

    The scope is `scope()` when given (an object that knows its Replicator, like a
    wrapped optimizer, passes it, so it works even outside `Replicator.scope()`),
    else that of the strategy in force (none: plain variables). Safe from replica
    context (inside `Replicator.run`, all replicas must call it together, as with
    any collective), from cross-replica context, and with no strategy at all.
    `create` must build its initial values from static shapes, not from tensors of
    the step being traced.
    """
    context = tf.distribute.get_replica_context()
    if tf.distribute.has_strategy() and context is not None:
        return context.merge_call(
            lambda merged: _create_eagerly(scope or (lambda: _scope_for(merged)), create)
        )
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    return _create_eagerly(scope or (lambda: _scope_for(strategy)), create)


def _create_eagerly(scope: Callable[[], ContextManager], create: Callable[[], T]) -> T:
    with tf.init_scope(), scope():
        return create()
