"""Weight transport through the Reverb "params" table (max_size 1: the latest weights).

The learner publishes `[version, *arrays]` (version = its update count); actors and the
evaluator pull with a `VariableClient`. Reverb is the whole data plane, so a node needs
nothing but the replay address.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np
import reverb

from agents.d4pg.replay import PARAMS_TABLE, table_size

_log = logging.getLogger(__name__)
_POLL_S = 0.2  # How often `VariableClient.update(wait=True)` looks for a first publish.


class WeightsUnavailableError(TimeoutError):
    """No learner published weights within the wait (`VariableClient.update(wait=True)`)."""


def publish(
    client: reverb.Client, version: int, arrays: Sequence[np.ndarray], table: str = PARAMS_TABLE
) -> None:
    """Makes `arrays` the latest weights (replacing the previous ones), tagged `version`."""
    data = [np.asarray(version, np.int64)] + [np.asarray(a, np.float32) for a in arrays]
    client.insert(data, priorities={table: 1.0})


class WeightsPublisher:
    """`publish` through one long-lived trajectory writer: the learner's way to publish.

    `reverb.Client.insert` opens, fills and closes a writer per call; a learner that
    publishes every call of its update spent more time there than in the update (with
    reading its variables one by one). Its items have the table's signature exactly;
    `publish`'s come back with a leading time dimension of 1, and `VariableClient` reads
    both (a replay checkpoint of an earlier run may hold either).

    Args:
      client: a `reverb.Client` of the server holding the "params" table.
      table: the params table name.
      timeout_ms: how long `publish` waits for the server to confirm (-1: no bound;
        a server that went away then blocks it for ever).
    """

    def __init__(self, client: reverb.Client, table: str = PARAMS_TABLE, timeout_ms: int = -1):
        self._table = table
        self._timeout_ms = timeout_ms
        self._writer = client.trajectory_writer(num_keep_alive_refs=1)
        self._cpp = self._writer._writer  # pylint: disable=protected-access
        self._configured = 0

    def publish(self, version: int, arrays: Sequence[np.ndarray], wait: bool = True) -> None:
        """Makes `arrays` the latest weights, tagged `version`.

        With `wait` it returns once the server stored them; without, once the previous
        publish was stored (this one is on its way): a learner publishing every few
        updates then does not wait for a round trip each time.
        """
        data = [np.asarray(version, np.int64)] + [np.asarray(a, np.float32) for a in arrays]
        for column in range(self._configured, len(data)):  # One-step chunks: no history.
            self._cpp.ConfigureChunker(
                column,
                reverb.pybind.ConstantChunkerOptions(max_chunk_length=1, num_keep_alive_refs=1),
            )
        self._configured = max(self._configured, len(data))
        references = self._cpp.Append(data)
        self._cpp.CreateItem(self._table, 1.0, [[r] for r in references], [True] * len(references))
        self._flush(0 if wait else 1)

    def wait(self) -> None:
        """Returns once every publish so far is stored (e.g. the last one of `wait=False`)."""
        self._flush(0)

    def _flush(self, in_flight: int) -> None:
        try:
            self._cpp.Flush(in_flight, self._timeout_ms)
        except RuntimeError as e:
            # A server that went away is not an error here: the items just wait (for ever
            # without a timeout). Raised as `reverb.Client`'s own calls do.
            if "Timeout exceeded" in str(e):
                raise reverb.errors.DeadlineExceededError(
                    f"publishing weights to {self._table!r} took over {self._timeout_ms} ms "
                    f"(is the replay down?): {e}"
                ) from None
            raise

    def close(self) -> None:
        self._writer.close()


class VariableClient:
    """Pulls the latest published weights; every `update_period` calls of `update()`.

    Args:
      client: a `reverb.Client` of the server holding the "params" table.
      update_period: `update()` fetches on one call in this many; `update(wait=True)`
        always fetches.
      table: the params table name.
      timeout_s: how long a fetch may wait for the server to answer before it raises
        (`reverb.Client.sample` would wait for ever on a server that went away).
      wait_timeout_s: how long `update(wait=True)` waits for a first publish before it
        raises `WeightsUnavailableError`.

    Example:
      variables = VariableClient(reverb.Client(address), update_period=1000)
      variables.update(wait=True)        # blocks until the learner published once
      weights, version = variables.weights, variables.version
    """

    def __init__(
        self,
        client: reverb.Client,
        update_period: int = 1,
        table: str = PARAMS_TABLE,
        timeout_s: int = 5,
        wait_timeout_s: float = 600.0,
    ):
        self._client = client
        self._timeout = timeout_s
        self._wait_timeout = wait_timeout_s
        self._period = max(1, int(update_period))
        self._table = table
        self._calls_since_attempt = 0
        self.weights: list[np.ndarray] | None = None
        self.version: int = -1

    def update(self, wait: bool = False) -> bool:
        """Fetches the latest weights when due; returns whether it did.

        Due: with `wait`, while no weights were fetched yet, or on every `update_period`-th
        call since the last attempt. Non-blocking unless `wait`: while the table is empty
        (before the learner's first publish, or after a replay restarted without its
        weights) it returns False and the weights in use stay. With `wait` it polls the
        table until weights arrive, for at most `wait_timeout_s`.

        Raises:
          WeightsUnavailableError: `wait` and still no weights after `wait_timeout_s`.
          reverb.errors.DeadlineExceededError: the server did not answer in `timeout_s`.
        """
        self._calls_since_attempt += 1
        due = wait or self.weights is None or self._calls_since_attempt >= self._period
        if not due:
            return False
        self._calls_since_attempt = 0
        deadline = time.monotonic() + self._wait_timeout
        # Sampling an empty table blocks for ever (Reverb's `sample` has no deadline), so
        # the size is read first; the table only shrinks by a replay restart (max_size 1).
        while not self._has_weights():
            if not wait:
                return False
            if time.monotonic() >= deadline:
                raise WeightsUnavailableError(
                    f"no weights in the {self._table!r} table after {self._wait_timeout:.0f}s: "
                    "is the learner running? (read its log)"
                )
            time.sleep(_POLL_S)
        sample = next(self._client.sample(self._table, num_samples=1, emit_timesteps=False))
        flat = [np.asarray(column) for column in sample.data]
        if flat[0].ndim == 1:  # Written by `insert` (a leading time dimension of 1).
            flat = [column[0] for column in flat]
        self.version = int(flat[0])
        self.weights = flat[1:]
        return True

    def _has_weights(self) -> bool:
        # Raises (DeadlineExceededError) instead of blocking when the server is gone.
        return table_size(self._client, self._table, timeout=self._timeout) > 0
