"""Replay items of G whole n-step transitions: Reverb's per-item cost paid once per G.

With one transition per item (`adders.NStepTransitionAdder`) an actor pays ~45 us of
Reverb `Append`/`CreateItem` per environment step and the learner ~25 us of sampling per
transition, more than the physics of a step and the maths of an update. Here each item
holds G complete transitions, so both costs fall by G. An item is one float32 array of G
rows (`replay.GroupedRowLayout`):

    row g = [o_t | a_t | r_t..r_{t+m-1}, 0.. | d_t..d_{t+m-1}, -1.. | o_{t+m}]

one transition exactly as `NStepTransitionAdder` writes it (the same transitions, the
short ones of an episode's end and, with `short_transitions_from_first_state`, of its
start), its n - m unused rewards and discounts padded with 0 and discount -1 (the mask
`losses.n_step_return` uses).

Which transitions share an item. An actor's transitions, from any of its environments,
go into one pool of `pool_size` transitions; when it is full, G of them drawn uniformly
without replacement leave it as one item. Every transition is written exactly once, so
the replay holds the same transitions as with one per item (minus at most the pool's
content and the items held for one write, `items_per_write`, when an actor stops).
Sampling items uniformly samples every transition with the same probability, but the
B / G items of a batch each bring G transitions of one actor from a window of roughly its
last `pool_size` steps, not B independent draws. Writing G consecutive transitions
instead would give a batch B / G runs of near duplicates; the pool spreads a group over
that window and over the actor's environments.

Observations are stored inline: o_{t+m} is stored again as a later transition's o_t.
For state features this doubles a few hundred bytes per transition; pixels keep the
one-transition layout, which stores each frame once (`D4PGConfig` refuses G > 1 there).
"""

from __future__ import annotations

import collections

import dm_env
import numpy as np
import reverb

from agents import core
from agents.d4pg.replay import REPLAY_TABLE, GroupedRowLayout


class TransitionGroupWriter:
    """Pools one actor's whole transitions and writes them G at a time as Reverb items.

    Args:
      client: a `reverb.Client` of the replay server.
      group_size: G, transitions per item.
      layout: where each field lies in a row (`GroupedRowLayout.of(env_spec, config)`).
      pool_size: transitions held before G are drawn (>= G).
      seed: seed of the draws.
      table: the table to insert into (signature: `replay.replay_signature(spec, config)`).
      priority: the priority of every item (uniform replay ignores it).
      max_in_flight_items: items the writer may hold unconfirmed; beyond that `add`
        blocks, which is how the table's rate limiter slows an actor down. Checked every
        `flush_every` items (a check waits for the server, so not after each one).
      items_per_write: items held back and handed to Reverb together, back to back
        (`D4PGConfig.items_per_write`): Reverb's client calls cost several times more
        one at a time between environment steps, their code and data out of the CPU
        caches. The unconfirmed items allowed then grow to at least this many, and the
        check runs once per write.

    The pool is one preallocated [pool_size, width] array whose rows are filled in place
    (one `np.concatenate` per transition) and never moved: an item is one `np.take` of G
    drawn rows, and the rows it took are refilled by the next transitions. An actor calls
    `add` once per environment step, so it costs one numpy call, not one per field.

    Example:
      writer = TransitionGroupWriter(client, 16, GroupedRowLayout((5,), (1,), n_step=5))
      adders = [NStepGroupAdder(writer, 5) for _ in range(num_envs)]
    """

    def __init__(
        self,
        client: reverb.Client,
        group_size: int,
        layout: GroupedRowLayout,
        pool_size: int = 256,
        seed: int = 0,
        table: str = REPLAY_TABLE,
        priority: float = 1.0,
        max_in_flight_items: int = 8,
        flush_every: int = 4,
        items_per_write: int = 1,
    ):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if pool_size < group_size:
            raise ValueError(f"pool_size ({pool_size}) must be >= group_size ({group_size})")
        if items_per_write < 1:
            raise ValueError(f"items_per_write must be >= 1, got {items_per_write}")
        self._group = group_size
        self._table = table
        self._priority = float(priority)
        self._items_per_write = items_per_write
        self._max_in_flight = max(max_in_flight_items, items_per_write)
        self._flush_every = max(flush_every, items_per_write)
        self._held: list[np.ndarray] = []  # Drawn items not yet handed to Reverb.
        self._rng = np.random.default_rng(seed)
        self._n = layout.n_step
        self._width = layout.width
        # Padding of the rewards (0) and discounts (-1) after m < n, sliced to n - m.
        self._reward_pad = np.zeros(layout.n_step, np.float32)
        self._discount_pad = np.full(layout.n_step, -1.0, np.float32)
        self._pool = np.zeros((pool_size, layout.width), np.float32)
        # Rows free to fill, taken from the end; all of them at first, row 0 first.
        self._free = list(range(pool_size - 1, -1, -1))
        self._written = 0
        self._items = 0
        writer = client.trajectory_writer(num_keep_alive_refs=1)
        self._writer = writer  # Owns the C++ writer's lifetime.
        self._cpp = writer._writer  # pylint: disable=protected-access
        # Every item is one step of its own: one-step chunks, so a sample fetches and
        # decompresses exactly its own G transitions.
        self._cpp.ConfigureChunker(
            0, reverb.pybind.ConstantChunkerOptions(max_chunk_length=1, num_keep_alive_refs=1)
        )

    @property
    def pending(self) -> int:
        """Transitions in the pool, not yet in any item."""
        return len(self._pool) - len(self._free)

    @property
    def held(self) -> int:
        """Transitions drawn into items that wait to be handed to Reverb together."""
        return self._group * len(self._held)

    @property
    def transitions_written(self) -> int:
        """Transitions handed to Reverb in items so far (G per item)."""
        return self._written

    def add(self, observation, action, rewards, discounts, next_observation) -> None:
        """Pools one transition (m = len(rewards) <= n); writes an item when the pool is full.

        The arguments are copied at once (the caller may reuse their buffers): one
        `np.concatenate` into a free row of the pool, with the n - m padding.
        """
        pad = self._n - len(rewards)
        if pad < 0 or len(discounts) != len(rewards):
            raise ValueError(
                f"a transition holds m <= n={self._n} rewards and as many discounts; got "
                f"{len(rewards)} rewards and {len(discounts)} discounts"
            )
        np.concatenate(
            (
                observation,
                action,
                rewards,
                self._reward_pad[:pad],
                discounts,
                self._discount_pad[:pad],
                next_observation,
            ),
            axis=None,
            out=self._pool[self._free.pop()],
        )
        if not self._free:
            self._write_group(len(self._pool))

    def _write_group(self, occupied: int) -> None:
        """Writes G transitions drawn uniformly from the pool's `occupied` filled rows.

        With a full pool every row is filled, so the draw is over row numbers directly.
        """
        if occupied == len(self._pool):
            chosen = self._rng.choice(occupied, self._group, replace=False)
        else:
            filled = np.ones(len(self._pool), bool)
            filled[self._free] = False
            chosen = self._rng.choice(np.flatnonzero(filled), self._group, replace=False)
        # A new array (Reverb may keep it); the rows it took are free for the next ones.
        self._held.append(np.take(self._pool, chosen, axis=0))
        self._free.extend(chosen.tolist())
        if len(self._held) >= self._items_per_write:
            self._write_held()

    def _write_held(self) -> None:
        """Hands the held items to Reverb, oldest first, one `Append` and `CreateItem` each."""
        for group in self._held:
            (reference,) = self._cpp.Append([group])
            self._cpp.CreateItem(self._table, self._priority, [[reference]], [True])
            self._written += self._group
            self._items += 1
            if self._items % self._flush_every == 0:
                self._cpp.Flush(self._max_in_flight, -1)
        self._held.clear()

    def write_pending(self) -> None:
        """Writes every whole group the pool holds and every held item (at most G - 1
        transitions stay in the pool)."""
        while self.pending >= self._group:
            self._write_group(self.pending)
        self._write_held()

    def flush(self, timeout_ms: int | None = None) -> None:
        """Hands the held items to Reverb and blocks until every item written so far has
        reached the server."""
        self._write_held()
        self._writer.flush(timeout_ms=timeout_ms)

    def close(self) -> None:
        self._writer.close()


class NStepGroupAdder(core.Adder):
    """The n-step transitions of one environment, handed whole to a `TransitionGroupWriter`.

    The same transitions as `adders.NStepTransitionAdder` (see its docstring): for every t
    of an episode of T steps, o_t, a_t, r_t..r_{t+m-1}, d_t..d_{t+m-1}, o_{t+m} with
    m = min(n, T - t), and with `short_transitions_from_first_state` also o_0 -> o_m for
    m = 1 .. min(n, T) - 1. Several adders (one per environment of a batched actor) may
    share one writer.
    """

    def __init__(
        self,
        writer: TransitionGroupWriter,
        n_step: int,
        short_transitions_from_first_state: bool = False,
    ):
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        self._writer = writer
        self._n = n_step
        self._short_start = short_transitions_from_first_state
        self._observations: collections.deque = collections.deque()  # o_t .. newest
        self._actions: collections.deque = collections.deque()  # a_t .. newest
        # The window's rewards and discounts, each written at i and i + n of a ring of 2n:
        # those from any step of the window to the newest are one contiguous view, which
        # the writer copies with the rest of the row in one call.
        self._rewards = np.zeros(2 * n_step, np.float32)
        self._discounts = np.zeros(2 * n_step, np.float32)
        self._head = 0  # Ring position of the window's oldest step, o_t's.

    def reset(self) -> None:
        """Drops the unfinished episode: its steps create no further transitions."""
        self._observations.clear()
        self._actions.clear()
        self._head = 0

    def add_first(self, timestep: dm_env.TimeStep) -> None:
        if not timestep.first():
            raise ValueError(
                "add_first needs the episode's first timestep (StepType.FIRST); "
                f"got {timestep.step_type}."
            )
        self.reset()  # A previous episode cut short is forgotten.
        self._observations.append(timestep.observation)

    def add(self, action: np.ndarray, next_timestep: dm_env.TimeStep) -> None:
        if not self._observations:
            raise ValueError("add() called before add_first() in this episode.")
        position = (self._head + len(self._actions)) % self._n
        self._rewards[position] = self._rewards[position + self._n] = next_timestep.reward
        self._discounts[position] = self._discounts[position + self._n] = next_timestep.discount
        self._actions.append(action)
        self._observations.append(next_timestep.observation)
        if len(self._actions) == self._n:
            self._emit(0)  # o_t -> o_{t+n} is complete: t leaves the window.
            self._observations.popleft()
            self._actions.popleft()
            self._head = (self._head + 1) % self._n
        elif self._short_start and not next_timestep.last():
            # The window has not been full yet: o_0 -> o_m, m = steps < n (at an end, the
            # loop below writes it).
            self._emit(0)
        if next_timestep.last():
            for start in range(len(self._actions)):
                self._emit(start)
            self.reset()

    def _emit(self, start: int) -> None:
        """The transition from the window's `start`-th observation to its newest one."""
        first = self._head + start
        last = self._head + len(self._actions)  # Exclusive; first < last <= first + n.
        self._writer.add(
            self._observations[start],
            self._actions[start],
            self._rewards[first:last],
            self._discounts[first:last],
            self._observations[-1],
        )
