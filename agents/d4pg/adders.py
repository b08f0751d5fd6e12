"""N-step transition adder: each step written once, items reference slices of history.

Per environment step t the writer appends ONE step (o_t, a_t, r_t, d_t), where r_t, d_t
are the reward and discount of the timestep a_t led to. Items are references into that
history, so an observation is stored once however many items use it:

    item for t = (o_t, a_t, r_t..r_{t+m-1}, d_t..d_{t+m-1}, o_{t+m}),   m = min(n, T - t)

where T is the index of the episode's last timestep. Mid-episode m = n; the last n-1
transitions of an episode have m < n (exact n-step semantics, no padding):
`losses.n_step_return` computes R_t and D_t from the two slices, whatever their length.

At the end of an episode the final observation o_T is appended as one more step (with a
zero action, reward and discount that no item references), the remaining items are
created and the episode is flushed to the server.

With `short_transitions_from_first_state` the adder also writes, as Acme's
NStepTransitionAdder does, the transitions shorter than n that start at the episode's
first state:

    (o_0, a_0, r_0..r_{m-1}, d_0..d_{m-1}, o_m),   m = 1 .. min(n, T) - 1

each as soon as o_m is appended (one item per step, like the items after them). An
episode of length T then creates T + min(n, T) - 1 items instead of T, so the replay's
items, the rate limiter's inserts and samples per insert count these too (as Acme's do).
"""

from __future__ import annotations

import collections

import dm_env
import numpy as np
import reverb

from agents import core
from agents.d4pg.replay import REPLAY_TABLE

_FLUSH_EVERY = 8  # Steps between checks of the in-flight bound.


class NStepTransitionAdder(core.Adder):
    """Writes n-step transitions of one actor into a Reverb table.

    Args:
      client: a `reverb.Client` of the replay server.
      n_step: n >= 1.
      action_shape: shape of one action (to write the zero action of the final step).
      table: the table to insert items into (signature: `replay.ReplayItem`).
      priority: the priority of every item (uniform replay ignores it).
      max_in_flight_items: items the writer may hold unconfirmed (created, or sent and not
        yet accepted by the server); beyond that `add` blocks. This is how the table's
        rate limiter slows an actor down (item creation alone never blocks). The bound is
        checked every `_FLUSH_EVERY` steps and an episode's end creates up to n - 1 more
        items at once, so up to max_in_flight_items + 8 + n - 1 can be pending. Reverb's
        writer logs a warning for every 10 items once 50 are pending, which under a
        blocking rate limiter filled actor logs with thousands of lines a minute at the
        former default of 64; 32 stays below 50 for n <= 10.
      short_transitions_from_first_state: also write o_0 -> o_m for m < n (see the
        module docstring). They stay within the bound: an episode starts with nothing
        pending (ending the previous one waits for all its items) and creates at most one
        item per step until its first check (at the first multiple of 8 steps above n),
        so fewer than n + 8 are pending then, or 2n + 7 if the episode ends first.

    Example:
      adder = NStepTransitionAdder(reverb.Client("localhost:1234"), n_step=5, action_shape=(1,))
      adder.add_first(env.reset())
      adder.add(action, env.step(action))

    Implementation note: `reverb.TrajectoryWriter`'s Python layer (nest flattening, history
    views, column objects) costs ~100 us per step, more than the MuJoCo step itself, so
    this adder drives the writer's C++ binding directly with flat lists of columns and
    keeps its own ring buffer of the last n+1 steps' data references (~20 us per step).
    The C++ writer still validates every item against the table signature. This relies
    on dm-reverb 0.14.0 (pinned); `tests/agents/test_adders.py` checks the items exactly.
    """

    def __init__(
        self,
        client: reverb.Client,
        n_step: int,
        action_shape=(1,),
        table: str = REPLAY_TABLE,
        priority: float = 1.0,
        max_in_flight_items: int = 32,
        chunk_length: int | None = None,
        short_transitions_from_first_state: bool = False,
    ):
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        self._n = n_step
        self._short_start = short_transitions_from_first_state
        self._table = table
        self._priority = float(priority)
        self._max_in_flight = max_in_flight_items
        self._zero_action = np.zeros(action_shape, np.float32)
        self._zero = np.float32(0.0)
        keep_alive = max(n_step + 1, chunk_length or 0)
        writer = client.trajectory_writer(num_keep_alive_refs=keep_alive)
        self._writer = writer  # Owns the C++ writer's lifetime.
        self._cpp = writer._writer  # pylint: disable=protected-access
        if chunk_length is not None:
            for column in range(4):
                self._cpp.ConfigureChunker(
                    column,
                    reverb.pybind.ConstantChunkerOptions(
                        max_chunk_length=chunk_length, num_keep_alive_refs=keep_alive
                    ),
                )
        # References (observation, action, reward, discount) of the last n+1 appended steps.
        self._history: collections.deque = collections.deque(maxlen=n_step + 1)
        self._observation = None  # o_t, waiting for a_t, r_t, d_t.
        self._steps = 0  # Steps appended in this episode.

    def reset(self) -> None:
        """Drops the unfinished episode: its buffered steps create no further items."""
        self._cpp.EndEpisode(True, None)
        self._history.clear()
        self._observation = None
        self._steps = 0

    def add_first(self, timestep: dm_env.TimeStep) -> None:
        if not timestep.first():
            raise ValueError(
                "add_first needs the episode's first timestep (StepType.FIRST); "
                f"got {timestep.step_type}."
            )
        if self._steps or self._observation is not None:
            self.reset()  # The previous episode was cut short: forget it.
        self._observation = timestep.observation

    def add(self, action: np.ndarray, next_timestep: dm_env.TimeStep) -> None:
        if self._observation is None:
            raise ValueError("add() called before add_first() in this episode.")
        self._append(
            np.asarray(action, np.float32),
            np.float32(next_timestep.reward),
            np.float32(next_timestep.discount),
        )
        self._observation = next_timestep.observation
        if self._steps > self._n:
            # Step t = steps - 1 - n can now see o_{t+n}, the observation just appended.
            self._create_item(self._n)
            if self._steps % _FLUSH_EVERY == 0:  # The bound needs no per-step check.
                self._cpp.Flush(self._max_in_flight, -1)
        elif self._short_start and self._steps > 1:
            # o_0 -> o_m, m = steps - 1 < n: the newest appended step holds o_m.
            self._create_item(self._steps - 1)
        if next_timestep.last():
            self._finish_episode()

    def _append(self, action, reward, discount) -> None:
        self._history.append(self._cpp.Append([self._observation, action, reward, discount]))
        self._steps += 1

    def _create_item(self, m: int) -> None:
        """Item for the transition starting m steps before the newest appended step."""
        history = self._history
        start = len(history) - m - 1
        first, last = history[start], history[-1]
        steps = [history[i] for i in range(start, len(history) - 1)]
        columns = [
            [first[0]],  # observation o_t (squeezed)
            [first[1]],  # action a_t (squeezed)
            [step[2] for step in steps],  # rewards r_t..r_{t+m-1}
            [step[3] for step in steps],  # discounts d_t..d_{t+m-1}
            [last[0]],
        ]  # next_observation o_{t+m} (squeezed)
        self._cpp.CreateItem(self._table, self._priority, columns, [True, True, False, False, True])

    def _finish_episode(self) -> None:
        # The final observation o_T is the last step; its action/reward/discount are unused.
        self._append(self._zero_action, self._zero, self._zero)
        for m in range(min(self._n, self._steps - 1), 0, -1):
            self._create_item(m)
        self._cpp.EndEpisode(True, None)
        self._history.clear()
        self._observation = None
        self._steps = 0

    def flush(self, timeout_ms: int | None = None) -> None:
        """Blocks until every created item has reached the server."""
        self._writer.flush(timeout_ms=timeout_ms)

    def close(self) -> None:
        self._writer.close()
