"""Runs a `Program` on a backend: start order, restarts with backoff, phased shutdown.

The supervision logic is the same for every backend; a backend only knows how to
start one node (`Backend.start`) and how to poll, stop and kill what it started
(`NodeHandle`). Signals: the first SIGINT/SIGTERM/SIGHUP asks every node to stop (by
phase, so servers save last), or lets a shutdown already under way go on; a second one
kills everything at once.

Failure handling (see docs/fault-tolerance.md): a failed node restarts with backoff
within its restart budget (a node that returns unasked, unless it `may_finish`, has
failed); a deterministic failure (import error, bad config) or an
exhausted budget stops the run with the node's last log lines; a node that publishes
a new value (e.g. a replay restarted on another machine) gets the nodes that use the
value restarted with it; a node with a `Node.stall_timeout` whose heartbeats stop is
killed and fails like a crash (a stuck collective cannot time out by itself); a
stateful node that fails to stop cleanly is reported in
`Outcome.stop_failures`, so the exit status can say so.
"""

from __future__ import annotations

import collections
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from launch.runtime.context import HEARTBEAT_KEY, STOP_TIME_KEY
from launch.runtime.program import Node, Program, resolve_refs

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_TAIL_LINES = 15


@dataclasses.dataclass(frozen=True)
class Exit:
    """How a node ended: `ok` for a clean return, else a short description.

    `deterministic` marks a failure that a restart cannot cure (see
    `launch.runtime.errors.is_deterministic`).
    """

    ok: bool
    description: str = ""
    deterministic: bool = False


class NodeHandle(Protocol):
    def poll(self) -> Exit | None: ...  # None while running
    def request_stop(self) -> None: ...  # ask the body to return
    def kill(self) -> None: ...  # end it now (best effort for threads)
    def published(self) -> dict[str, Any]: ...  # values it published so far
    def drain(self) -> None: ...  # move buffered metrics/logs to the run dir
    def log_hint(self) -> str: ...  # where to read its output


class Backend(Protocol):
    name: str

    def start(self, node: Node, kwargs: dict, attempt: int) -> NodeHandle: ...
    def close(self) -> None: ...

    # Optional: `fatal_condition() -> str | None`, a failure of what the nodes run on
    # that no restart can repair (the Ray head lost), as one line; the run then stops.


@dataclasses.dataclass
class Outcome:
    """Why `Supervisor.run` returned.

    Attributes:
      reason: "finished" (the `finished` callback or every node returned),
        "interrupted" (signal or `request_stop`), or "failed" (a fatal node failure).
      message: A human-readable explanation; for "failed", what to do next.
      restarts: Restarts per node during this run.
      progress: The launcher's aggregated metrics, when run through `launch.runtime.launcher`.
      stop_failures: One line per stateful node that did not stop cleanly (failed while
        stopping, e.g. its final save raised, or was killed at its stop deadline),
        naming the node and its log. Empty when every state was saved.
    """

    reason: str
    message: str = ""
    restarts: dict[str, int] = dataclasses.field(default_factory=dict)
    progress: Any = None  # The launcher's aggregated metrics (`launch.runtime.metrics.Progress`).
    stop_failures: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _State:
    node: Node
    handle: NodeHandle | None = None
    attempt: int = -1
    started_at: float = 0.0
    next_start: float = 0.0
    consecutive_failures: int = 0
    restarts: int = 0
    done: bool = False
    failure_times: collections.deque = dataclasses.field(default_factory=collections.deque)
    restart_for: str = ""  # Published keys whose change made us stop this node.
    restart_deadline: float = 0.0  # When a node stopped for `restart_for` gets killed.
    awaiting_restart: bool = False  # Failed; its restart is scheduled (`next_start`).
    # The stall watchdog (`Node.stall_timeout`): the heartbeat value seen last, and when
    # it last changed in this start (None until the body's first heartbeat).
    heartbeat_seen: Any = None
    heartbeat_at: float | None = None

    def arm_watchdog(self, published: dict[str, Any]) -> None:
        """At each start: the heartbeat published by an earlier start does not count."""
        self.heartbeat_seen = published.get(HEARTBEAT_KEY + self.node.name)
        self.heartbeat_at = None


class Supervisor:
    """Starts, watches and stops the nodes of one program.

    Args:
      program: What to run.
      backend: Where to run it.
      on_tick: Called about every `tick_interval` seconds from the supervising thread
        (progress lines, metrics files); may return True to finish the run.
      echo: Where supervision messages go (default stderr).
      stop_grace: If set, caps every node's `stop_timeout` (seconds from a stop
        request to a kill).
    """

    def __init__(
        self,
        program: Program,
        backend: Backend,
        *,
        on_tick: Callable[[], bool | None] | None = None,
        tick_interval: float = 1.0,
        poll_interval: float = 0.2,
        stop_grace: float | None = None,
        echo: Callable[[str], None] | None = None,
    ):
        self._program = program
        self._backend = backend
        self._on_tick = on_tick
        self._tick_interval = tick_interval
        self._poll_interval = poll_interval
        self._stop_grace = stop_grace
        self._echo = echo or (lambda m: print(m, file=sys.stderr, flush=True))
        self._states = {n.name: _State(n) for n in program.nodes}
        self._published: dict[str, Any] = {}
        self._stop = threading.Event()
        self._force = threading.Event()
        self._fatal: str | None = None
        self._stop_reason = "interrupted"
        self._stop_failures: list[str] = []
        self._signals = 0  # Stop signals the user sent (see `_install_signal_handlers`).
        # Optional on a backend (see `Backend`): None means no such condition.
        self._fatal_condition = getattr(backend, "fatal_condition", lambda: None)

    # Control from other threads or signal handlers.
    def request_stop(self, reason: str = "interrupted") -> None:
        self._stop_reason = reason
        self._stop.set()

    def handles(self) -> dict[str, NodeHandle]:
        """The live handle of every node started so far (for tests and tools)."""
        return {name: s.handle for name, s in self._states.items() if s.handle is not None}

    def restarts(self) -> dict[str, int]:
        return {name: s.restarts for name, s in self._states.items()}

    @property
    def published(self) -> dict[str, Any]:
        return dict(self._published)

    def run(self) -> Outcome:
        """Runs the program until it finishes, fails, or is asked to stop."""
        previous = self._install_signal_handlers()
        try:
            self._loop()
        finally:
            try:
                self._shutdown()
            finally:
                self._restore_signal_handlers(previous)
        restarts = self.restarts()
        failures = list(self._stop_failures)
        if self._fatal is not None:
            return Outcome("failed", self._fatal, restarts, stop_failures=failures)
        return Outcome(self._stop_reason, "", restarts, stop_failures=failures)

    # Internals.
    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum, frame):
            del frame
            # Only the user's signals count: a shutdown the launcher began itself (budget
            # reached, a fatal failure) is not a first signal.
            self._signals += 1
            name = signal.Signals(signum).name
            if self._signals > 1:
                self._echo("[launch] second signal: killing every node now")
                self._force.set()
            elif self._stop.is_set():
                self._echo(
                    f"[launch] {name}: already stopping every node, which may be saving "
                    "(press Ctrl-C again to kill them at once)"
                )
            else:
                self._echo(
                    f"[launch] {name}: stopping every node "
                    "(press Ctrl-C again to kill them at once)"
                )
                self.request_stop("interrupted")

        previous = {s: signal.getsignal(s) for s in _STOP_SIGNALS}
        for s in previous:
            signal.signal(s, handler)
        return previous

    def _restore_signal_handlers(self, previous):
        if previous:
            for s, h in previous.items():
                signal.signal(s, h)

    def _loop(self) -> None:
        next_tick = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if self._stopped_for_fatal_condition():
                break
            self._collect_published()
            for state in self._states.values():
                if self._stop.is_set():
                    break
                if state.handle is None and not state.done and now >= state.next_start:
                    self._maybe_start(state)
                elif state.handle is not None:
                    self._check(state)
            if all(s.done for s in self._states.values()):
                self.request_stop("finished")
            if now >= next_tick:
                next_tick = now + self._tick_interval
                for state in self._states.values():
                    if state.handle is not None:
                        state.handle.drain()
                if self._on_tick is not None and self._on_tick():
                    self.request_stop("finished")
            self._stop.wait(self._poll_interval)

    def _stopped_for_fatal_condition(self) -> bool:
        """Stops the run if the backend reports a failure no restart can repair (the Ray
        head lost): every node is asked to stop (they save) and the reason is fatal."""
        condition = self._fatal_condition()
        if condition and not self._stop.is_set():
            self._fatal = condition
            self._echo(f"[launch] {condition}")
            self.request_stop("failed")
        return bool(condition)

    def _collect_published(self) -> None:
        changed = set()
        for state in self._states.values():
            if state.handle is not None:
                for key, value in state.handle.published().items():
                    if key in self._published and self._published[key] != value:
                        changed.add(key)
                    self._published[key] = value
        if changed:
            self._restart_users_of(changed)

    def _restart_users_of(self, keys: set[str]) -> None:
        """Restarts running nodes whose arguments hold a value that was republished changed.

        E.g. a replay restarted on another Ray machine publishes a new address: its
        clients are stopped (so they save) and started again with the new address.
        """
        for state in self._states.values():
            used = sorted(keys & set(state.node.refs()))
            if state.handle is not None and used and not state.restart_for:
                state.restart_for = ", ".join(used)
                state.restart_deadline = time.monotonic() + self._stop_timeout(state)
                self._echo(
                    f"[launch] {state.node.name}: {state.restart_for} changed; restarting it "
                    "with the new value"
                )
                state.handle.request_stop()

    def _maybe_start(self, state: _State) -> None:
        if state.node.group:
            self._maybe_start_group(state.node.group)
            return
        missing = [k for k in state.node.refs() if k not in self._published]
        if missing:
            return
        kwargs = resolve_refs(state.node.kwargs, self._published)
        state.attempt += 1
        state.started_at = time.monotonic()
        state.awaiting_restart = False
        state.arm_watchdog(self._published)
        try:
            state.handle = self._backend.start(state.node, kwargs, state.attempt)
        except Exception as e:  # pylint: disable=broad-except
            # The backend could not start it (e.g. no resources): a failure like any other.
            self._on_failure(
                state, Exit(False, f"could not start: {type(e).__name__}: {e}"), hint=""
            )

    def _check(self, state: _State) -> None:
        exit_ = state.handle.poll()
        if exit_ is None and state.restart_for and time.monotonic() >= state.restart_deadline:
            # Blocked on the old value (e.g. in a call to a server that moved): it had its
            # stop timeout to return, as at shutdown; the kill lets it restart.
            self._echo(
                f"[launch] {state.node.name}: still running {self._stop_timeout(state):g}s "
                "after the stop request; killed to restart it"
            )
            state.handle.kill()
            state.restart_deadline = float("inf")
            return
        if exit_ is None and self._stalled(state):
            return
        if exit_ is None:
            if (
                state.consecutive_failures
                and time.monotonic() - state.started_at > state.node.restart.healthy_after
            ):
                state.consecutive_failures = 0
            return
        state.handle.drain()
        self._published.update(state.handle.published())
        if state.restart_for:
            self._echo(f"[launch] {state.node.name}: restarting ({state.restart_for} changed)")
            state.handle, state.restart_for = None, ""
            state.restarts += 1
            state.next_start = time.monotonic()
            return
        if exit_.ok and state.node.may_finish:
            self._echo(f"[launch] {state.node.name} finished")
            state.done, state.handle = True, None
            return
        if exit_.ok and self._stopped_for_fatal_condition():
            state.handle = None  # It stopped for that condition (and saved): not a failure.
            return
        if exit_.ok:
            exit_ = Exit(False, "returned without being asked to stop: a stop signal of its own?")
        hint = state.handle.log_hint()
        tail = _log_tail(state.handle)
        state.handle = None
        self._on_failure(state, exit_, hint, tail)

    def _stalled(self, state: _State) -> bool:
        """The stall watchdog: True if it killed `state`'s node (no heartbeat for its
        `stall_timeout`), which then fails like a crash (a group restarts as a whole)."""
        timeout = state.node.stall_timeout
        if not timeout or state.restart_for:
            # (A node asked to stop for a changed value has its own deadline.)
            return False
        now = time.monotonic()
        beat = self._published.get(HEARTBEAT_KEY + state.node.name)
        if beat != state.heartbeat_seen:
            state.heartbeat_seen, state.heartbeat_at = beat, now
            return False
        if state.heartbeat_at is None or now - state.heartbeat_at < timeout:
            return False
        # Blocked without a deadline (e.g. an all-reduce whose peer hangs): only a kill
        # ends it, and the restart (from the last checkpoint) resumes the run.
        hint = state.handle.log_hint()
        state.handle.kill()
        state.handle.drain()
        tail = _log_tail(state.handle)
        state.handle = None
        self._on_failure(
            state,
            Exit(False, f"no heartbeat for {now - state.heartbeat_at:.0f}s: stuck; killed"),
            hint,
            tail,
        )
        return True

    def _on_failure(self, state: _State, exit_: Exit, hint: str, tail: str = "") -> None:
        name, policy = state.node.name, state.node.restart
        now = time.monotonic()
        state.consecutive_failures += 1
        state.failure_times.append(now)
        while state.failure_times and now - state.failure_times[0] > policy.restart_window:
            state.failure_times.popleft()
        why = ""
        if exit_.deterministic:
            why = "the error would recur on every restart (fix it, then relaunch)"
        elif not policy.restart:
            why = "it is not restartable"
        elif state.consecutive_failures > policy.max_consecutive_failures:
            why = f"it failed {state.consecutive_failures} times in a row"
        elif len(state.failure_times) > policy.max_restarts:
            why = (
                f"it failed {len(state.failure_times)} times within "
                f"{policy.restart_window / 60:g} min (restart budget: {policy.max_restarts})"
            )
        elif state.restarts >= policy.max_total_restarts:
            why = (
                f"it was restarted {state.restarts} times in this launch "
                f"(at most {policy.max_total_restarts})"
            )
        if why:
            self._fatal = (
                f"node {name!r} failed ({exit_.description}) and {why}; stopping the run. "
                f"{hint} {policy.fatal_hint}"
            ).strip()
            if tail:
                self._fatal += f"\nLast lines of its log:\n{tail}"
            self._echo(f"[launch] {self._fatal}")
            self.request_stop("failed")
            return
        delay = policy.backoff(state.consecutive_failures)
        state.restarts += 1
        state.next_start = now + delay
        state.awaiting_restart = True
        self._echo(
            f"[launch] {name} failed ({exit_.description}); restart #{state.restarts} "
            f"in {delay:.1f}s. {hint}"
        )
        if state.node.group:
            self._stop_group_peers(state)

    # Node groups (see `Node.group`): started together, restarted together.
    def _group(self, name: str) -> list[_State]:
        return [s for s in self._states.values() if s.node.group == name]

    def _maybe_start_group(self, name: str) -> None:
        members = self._group(name)
        now = time.monotonic()
        if any(m.handle is not None or m.done or now < m.next_start for m in members):
            return
        if any(k not in self._published for m in members for k in m.node.refs()):
            return
        kwargs = [resolve_refs(m.node.kwargs, self._published) for m in members]
        for m in members:
            m.attempt += 1
            m.started_at = now
            m.awaiting_restart = False
            m.arm_watchdog(self._published)
        try:
            start_group = getattr(self._backend, "start_group", None)
            if start_group is None:
                raise RuntimeError(
                    f"the {self._backend.name} backend cannot run node groups; use local or ray"
                )
            handles = start_group([m.node for m in members], kwargs, [m.attempt for m in members])
        except Exception as e:  # pylint: disable=broad-except
            self._on_failure(
                members[0], Exit(False, f"could not start: {type(e).__name__}: {e}"), hint=""
            )
            return
        for m, handle in zip(members, handles):
            m.handle = handle

    def _stop_group_peers(self, failed: _State) -> None:
        """Kills the failed node's group peers; all restart together when it does."""
        peers = [m for m in self._group(failed.node.group) if m is not failed]
        stopped = []
        for peer in peers:
            if peer.handle is not None:
                # Killed, not asked: a peer blocked in a collective with the lost member
                # cannot return, and it must not checkpoint a half-done update.
                peer.handle.kill()
                peer.handle.drain()
                peer.handle = None
                peer.restarts += 1
                peer.awaiting_restart = True
                stopped.append(peer.node.name)
            peer.next_start = max(peer.next_start, failed.next_start)
        delay = max(0.0, failed.next_start - time.monotonic())
        self._echo(
            f"[launch] group {failed.node.group!r}: {failed.node.name} failed, so "
            f"{', '.join(stopped) or 'no other member'} stopped too (collectives cannot lose a "
            f"member); the whole group ({', '.join(m.node.name for m in self._group(failed.node.group))}) "
            f"restarts in {delay:.1f}s from the last checkpoint"
        )

    def _stop_timeout(self, state: _State) -> float:
        """Seconds from a stop request to a kill: the node's, or what it asked for (its
        measured save time, `NodeContext.need_stop_time`) when longer; capped by
        `stop_grace`."""
        needed = self._published.get(STOP_TIME_KEY + state.node.name, 0.0)
        timeout = max(state.node.stop_timeout, float(needed))
        if self._stop_grace is None:
            return timeout
        return min(timeout, self._stop_grace)

    def _running(self, phase: int | None = None) -> list[_State]:
        return [
            s
            for s in self._states.values()
            if s.handle is not None and (phase is None or s.node.stop_phase == phase)
        ]

    def _reap(self) -> None:
        for state in self._running():
            exit_ = state.handle.poll()
            if exit_ is not None:
                state.handle.drain()
                if not exit_.ok:
                    if not self._force.is_set():
                        self._echo(f"[launch] {state.node.name} stopped ({exit_.description})")
                    self._stop_failed(state, f"failed while stopping ({exit_.description})")
                state.handle = None

    def _stop_failed(self, state: _State, what: str) -> None:
        """Records that a stateful node may not have saved (for the exit status)."""
        if not state.node.stateless:
            self._stop_failures.append(f"{state.node.name} {what}. {state.handle.log_hint()}")

    def _shutdown(self) -> None:
        """Stops the nodes phase by phase; a node still running after its timeout is killed.

        Phases let a program stop its nodes in the order that keeps state consistent,
        e.g. the learner first (it saves a checkpoint while actors still feed it), then
        the actors, then the replay server (which saves its tables last).
        """
        for state in self._states.values():
            if state.handle is not None:  # The newest stop times the nodes asked for.
                self._published.update(state.handle.published())
        for state in self._states.values():
            if state.awaiting_restart:
                # Failed, and waiting out its restart backoff: what it held since its last
                # save was lost with the failure, and no final save will happen.
                state.awaiting_restart = False
                if not state.node.stateless:
                    self._stop_failures.append(
                        f"{state.node.name} had failed and was waiting to restart: its state "
                        "is its last save before the failure."
                    )
        for phase in sorted({s.node.stop_phase for s in self._states.values()}):
            now = time.monotonic()
            deadlines = {}
            for state in self._running(phase):
                state.handle.request_stop()
                timeout = self._stop_timeout(state)
                deadlines[state.node.name] = (now + timeout, timeout)
            while self._running(phase):
                self._reap()
                for state in self._running(phase):
                    deadline, timeout = deadlines[state.node.name]
                    if self._force.is_set() or time.monotonic() >= deadline:
                        if self._force.is_set():
                            self._stop_failed(state, "was killed by a second stop signal")
                        elif not state.node.stateless:
                            self._echo(
                                f"[launch] {state.node.name}: still running {timeout:g}s after the "
                                "stop request (blocked in a call); killed"
                            )
                            self._stop_failed(
                                state, f"was killed {timeout:g}s after the stop request"
                            )
                        # A stateless node blocked at the stop (an actor waiting on the rate
                        # limiter once the learner has stopped) loses nothing by the kill:
                        # that ends every learner-bound run, so the console is not told.
                        state.handle.kill()
                        state.handle.drain()
                        state.handle = None
                time.sleep(0.05)
        self._backend.close()


def _log_tail(handle: NodeHandle) -> str:
    """The node's last log lines, when its backend can tell (for fatal messages)."""
    tail = getattr(handle, "log_tail", None)
    return tail(_TAIL_LINES) if tail is not None else ""
