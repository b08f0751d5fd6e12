"""Reverb tables of D4PG: "replay" (n-step transitions) and "params" (latest weights).

The replay holds `config.resolved_transitions_per_item()` = G transitions per item (see
`D4PGConfig`): its size, minimum size and rate limiter are set in items here, from the
config's figures in transitions (G transitions per item, so samples per insert is the
same number in items and in transitions). `transitions` converts counts back.

Reverb 0.14's server binds all interfaces ([::]:port) and has no host argument; clients
connect with `localhost:PORT` (same machine) or the address they are given.
"""

from __future__ import annotations

import collections
import itertools
import logging

import numpy as np
import reverb
import tensorflow as tf
from reverb.cc import schema_pb2

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


class GroupedRowLayout:
    """Where the fields of one transition lie in a row of the grouped layout (G > 1).

    A row is float32 [o_t | a_t | r_t..r_{t+n-1} | d_t..d_{t+n-1} | o_{t+m}]: an item is
    one [G, width] array, a single Reverb column, because Reverb compresses and sends
    every column of a step as its own chunk (five columns cost the actor about twice the
    CPU per item of one). Rewards and discounts after m are padded with discount -1,
    the mask `losses.n_step_return` uses. Observations are flattened feature vectors.
    """

    def __init__(self, observation_shape, action_shape, n_step: int):
        self.observation_shape = tuple(int(d) for d in observation_shape)
        self.action_shape = tuple(int(d) for d in action_shape)
        self.n_step = int(n_step)
        obs, act = int(np.prod(self.observation_shape)), int(np.prod(self.action_shape))
        bounds = np.cumsum([0, obs, act, n_step, n_step, obs])
        self.slices = ReplayItem(*(slice(a, b) for a, b in itertools.pairwise(bounds)))
        self.width = int(bounds[-1])

    @classmethod
    def of(cls, env_spec, config: D4PGConfig) -> GroupedRowLayout:
        return cls(env_spec.observations.shape, env_spec.actions.shape, config.n_step)

    def split(self, rows) -> ReplayItem:
        """The fields of rows [B, width] (numpy or TensorFlow), observations reshaped."""
        fields = ReplayItem(*(rows[:, part] for part in self.slices))
        reshape = tf.reshape if isinstance(rows, tf.Tensor) else np.reshape
        return fields._replace(
            observation=reshape(fields.observation, (-1,) + self.observation_shape),
            action=reshape(fields.action, (-1,) + self.action_shape),
            next_observation=reshape(fields.next_observation, (-1,) + self.observation_shape),
        )


def replay_signature(env_spec, config: D4PGConfig | None = None):
    """The "replay" table signature of `config`'s layout (default: one transition per item).

    One transition per item: a `ReplayItem`, unbatched, rewards/discounts of variable
    length m <= n. G > 1 (`D4PGConfig.resolved_transitions_per_item`): one float32 [G, width] tensor
    of G rows (`GroupedRowLayout`).
    """
    if config is not None and config.resolved_transitions_per_item() > 1:
        width = GroupedRowLayout.of(env_spec, config).width
        return tf.TensorSpec([config.resolved_transitions_per_item(), width], tf.float32)
    obs = env_spec.observations
    obs_spec = tf.TensorSpec(obs.shape, tf.dtypes.as_dtype(obs.dtype))
    return ReplayItem(
        observation=obs_spec,
        action=tf.TensorSpec(env_spec.actions.shape, tf.float32),
        rewards=tf.TensorSpec([None], tf.float32),
        discounts=tf.TensorSpec([None], tf.float32),
        next_observation=obs_spec,
    )


def items(transition_count: int, config: D4PGConfig) -> int:
    """Items holding `transition_count` transitions (rounded up)."""
    return -(-int(transition_count) // config.resolved_transitions_per_item())


def transitions(item_count: int, config: D4PGConfig) -> int:
    """Transitions in `item_count` items of `config`'s layout."""
    return int(item_count) * config.resolved_transitions_per_item()


def params_signature(config: D4PGConfig, env_spec) -> list[tf.TensorSpec]:
    """The "params" table signature: [version (int64 learner step), *acting variables]."""
    shapes = networks.acting_variable_shapes(config, env_spec)
    return [tf.TensorSpec([], tf.int64)] + [tf.TensorSpec(s, tf.float32) for s in shapes]


def make_rate_limiter(config: D4PGConfig) -> reverb.rate_limiters.RateLimiter:
    """SampleToInsertRatio keeping samples/inserts near `samples_per_insert`.

    The error buffer (how far the ratio may drift before one side blocks) is
    `min_replay_size * samples_per_insert * tolerance_rate`, at least 2 * max(1, spi) as
    Reverb requires. `samples_per_insert <= 0` disables the ratio (MinSize only), which
    is meant for benchmarks of acting without a learner. All in items: with G
    transitions per item an insert and a sample both move G transitions, so the ratio
    is unchanged and the sizes (and the buffer) are divided by G.
    """
    min_items = items(config.min_replay_size, config)
    if config.samples_per_insert <= 0:
        return reverb.rate_limiters.MinSize(min_items)
    spi = config.samples_per_insert
    error_buffer = max(
        min_items * spi * config.samples_per_insert_tolerance_rate, 2.0 * max(1.0, spi)
    )
    return reverb.rate_limiters.SampleToInsertRatio(
        samples_per_insert=spi, min_size_to_sample=min_items, error_buffer=error_buffer
    )


def make_tables(config: D4PGConfig, env_spec) -> list[reverb.Table]:
    """The two tables, with signatures so datasets and writers are checked."""
    replay = reverb.Table(
        name=REPLAY_TABLE,
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        max_size=max(1, config.max_replay_size // config.resolved_transitions_per_item()),
        rate_limiter=make_rate_limiter(config),
        signature=replay_signature(env_spec, config),
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


def table_info(
    client: reverb.Client, table: str = REPLAY_TABLE, timeout: int | None = None
) -> schema_pb2.TableInfo:
    """The server's `TableInfo` proto of `table`: its size, rate-limiter counts and more.

    Reads the server's table protos directly: `reverb.Client.server_info` also decodes
    every table's signature through TensorFlow (~1.5 ms against ~0.1 ms here), which an
    actor paid at each weights pull (`variables.VariableClient`) and the learner at each
    reading of its replay ratio (`diagnostics.ReplayRatio`).

    Raises:
      reverb.errors.DeadlineExceededError: no answer within `timeout` seconds (as
        `server_info`); without a timeout a server that went away blocks.
      KeyError: the server has no such table.
    """
    try:
        protos = client._client.ServerInfo(timeout or 0)  # pylint: disable=protected-access
    except RuntimeError as e:
        if "Deadline Exceeded" in str(e) and timeout is not None:
            raise reverb.errors.DeadlineExceededError(
                f"the replay server did not answer within {timeout}s: {e}"
            ) from None
        raise
    for proto in protos:
        info = schema_pb2.TableInfo.FromString(proto)
        if info.name == table:
            return info
    raise KeyError(f"the replay server has no table {table!r}")


def table_size(client: reverb.Client, table: str = REPLAY_TABLE, timeout: int | None = None) -> int:
    """Current number of items in `table` (`transitions(...)` converts to transitions);
    raises as `table_info`."""
    return int(table_info(client, table, timeout).current_size)
