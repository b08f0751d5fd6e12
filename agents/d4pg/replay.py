"""Reverb tables of D4PG: "replay" (n-step transitions) and "params" (latest weights).

Reverb 0.14's server binds all interfaces ([::]:port) and has no host argument; clients
connect with `localhost:PORT` (same machine) or the address they are given.
"""

from __future__ import annotations

import collections
import logging

import reverb
import tensorflow as tf

from agents.d4pg import networks
from agents.d4pg.config import D4PGConfig

REPLAY_TABLE = "replay"
PARAMS_TABLE = "params"

_log = logging.getLogger(__name__)


class ReplayItem(
    collections.namedtuple(
        "ReplayItem", ["observation", "action", "rewards", "discounts", "next_observation"]
    )
):
    """One replay item: o_t, a_t, r_t..r_{t+m-1}, d_t..d_{t+m-1}, o_{t+m} with 1 <= m <= n.

    `rewards` and `discounts` have length n except for the last m < n transitions of an
    episode; `losses.n_step_return` turns them into (R_t, D_t).
    """


def replay_signature(env_spec) -> ReplayItem:
    """The "replay" table signature (unbatched; rewards/discounts have variable length)."""
    obs = env_spec.observations
    obs_spec = tf.TensorSpec(obs.shape, tf.dtypes.as_dtype(obs.dtype))
    return ReplayItem(
        observation=obs_spec,
        action=tf.TensorSpec(env_spec.actions.shape, tf.float32),
        rewards=tf.TensorSpec([None], tf.float32),
        discounts=tf.TensorSpec([None], tf.float32),
        next_observation=obs_spec,
    )


def params_signature(config: D4PGConfig, env_spec) -> list[tf.TensorSpec]:
    """The "params" table signature: [version (int64 learner step), *acting variables]."""
    shapes = networks.acting_variable_shapes(config, env_spec)
    return [tf.TensorSpec([], tf.int64)] + [tf.TensorSpec(s, tf.float32) for s in shapes]


def make_rate_limiter(config: D4PGConfig) -> reverb.rate_limiters.RateLimiter:
    """SampleToInsertRatio keeping samples/inserts near `samples_per_insert`.

    The error buffer (how far the ratio may drift before one side blocks) is
    `min_replay_size * samples_per_insert * tolerance_rate`, at least 2 * max(1, spi) as
    Reverb requires. `samples_per_insert <= 0` disables the ratio (MinSize only), which
    is meant for benchmarks of acting without a learner.
    """
    if config.samples_per_insert <= 0:
        return reverb.rate_limiters.MinSize(config.min_replay_size)
    spi = config.samples_per_insert
    error_buffer = max(
        config.min_replay_size * spi * config.samples_per_insert_tolerance_rate, 2.0 * max(1.0, spi)
    )
    return reverb.rate_limiters.SampleToInsertRatio(
        samples_per_insert=spi, min_size_to_sample=config.min_replay_size, error_buffer=error_buffer
    )


def make_tables(config: D4PGConfig, env_spec) -> list[reverb.Table]:
    """The two tables, with signatures so datasets and writers are checked."""
    replay = reverb.Table(
        name=REPLAY_TABLE,
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        max_size=config.max_replay_size,
        rate_limiter=make_rate_limiter(config),
        signature=replay_signature(env_spec),
    )
    params = reverb.Table(
        name=PARAMS_TABLE,
        sampler=reverb.selectors.Fifo(),
        remover=reverb.selectors.Fifo(),
        max_size=1,
        rate_limiter=reverb.rate_limiters.MinSize(1),
        signature=params_signature(config, env_spec),
    )
    return [replay, params]


def make_replay_server(
    config: D4PGConfig, env_spec, port: int | None = None, checkpoint_dir: str | None = None
) -> reverb.Server:
    """Starts a Reverb server holding D4PG's tables.

    Args:
      config: replay sizes and rate limiting.
      env_spec: the environment's `EnvironmentSpec` (for the signatures).
      port: port to bind on all interfaces; None picks a free one (`server.port`).
      checkpoint_dir: where `reverb.Client(...).checkpoint()` writes the replay; a server
        started later with the same directory loads the latest checkpoint found there.

    Returns:
      The running `reverb.Server`; clients use `f"localhost:{server.port}"`.
    """
    checkpointer = None
    if checkpoint_dir is not None:
        checkpointer = reverb.checkpointers.DefaultCheckpointer(path=str(checkpoint_dir))
    server = reverb.Server(
        tables=make_tables(config, env_spec), port=port, checkpointer=checkpointer
    )
    _log.info("Reverb server for D4PG on port %d (checkpoints: %s)", server.port, checkpoint_dir)
    return server


def table_size(client: reverb.Client, table: str = REPLAY_TABLE, timeout: int | None = None) -> int:
    """Current number of items in `table`."""
    return int(client.server_info(timeout=timeout)[table].current_size)
