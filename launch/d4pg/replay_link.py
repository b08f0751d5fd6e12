"""How D4PG's client nodes (learner, actors, evaluator) ride out a replay restart.

The replay node restarts like any other node (it restores its last checkpoint and
rebinds the port it had), so a client keeps its address and only has to notice the
outage, wait for the server with a bounded number of probes, and rebuild its Reverb
pieces (dataset, writer, variable client). Every step is logged: a client is never
silently stuck on a dead replay, and gives up (its node fails, the supervisor takes
over) after `timeout_s`.

Measured with dm-reverb 0.14: a `TrajectoryWriter` reconnects by itself, a
`TrajectoryDataset` iterator must be recreated, and `Client.sample` can block for
ever on a dead server (hence the `server_info` probe with a timeout before sampling,
in `agents.d4pg.variables`).
"""

from __future__ import annotations

import time

# Error text of gRPC/Reverb/TF when the server went away or is restarting.
_CONNECTION_MARKERS = (
    "unavailable",
    "deadline",
    "socket closed",
    "connection reset",
    "connection refused",
    "failed to connect",
    "cancelled",
    "broken pipe",
    "transport",
)


class ReplayUnreachableError(RuntimeError):
    """The replay did not answer within the reconnection timeout."""


def is_connection_error(error: BaseException) -> bool:
    """True when `error` says the replay server is gone (not a bug of the caller)."""
    text = f"{type(error).__name__} {error}".lower()
    return any(marker in text for marker in _CONNECTION_MARKERS)


def replay_reachable(address: str, timeout_s: int = 2) -> bool:
    """One probe: does the replay at `address` answer `server_info` within `timeout_s`?"""
    import reverb  # pylint: disable=import-outside-toplevel

    try:
        reverb.Client(address).server_info(timeout=timeout_s)
        return True
    except Exception:  # pylint: disable=broad-except
        return False


def wait_for_replay(ctx, address: str, timeout_s: float = 600.0, log_every_s: float = 10.0) -> bool:
    """Probes the replay until it answers; False if the node was asked to stop meanwhile.

    Raises:
      ReplayUnreachableError: after `timeout_s` seconds without an answer.
    """
    start = time.monotonic()
    last_log = -log_every_s
    probes = 0
    while not ctx.should_stop():
        probes += 1
        if replay_reachable(address):
            if probes > 1:
                ctx.log(
                    f"replay at {address} answers again after {time.monotonic() - start:.1f}s "
                    f"({probes} probes)"
                )
            return True
        waited = time.monotonic() - start
        if waited >= timeout_s:
            raise ReplayUnreachableError(
                f"the replay at {address} did not answer for {waited:.0f}s ({probes} probes); "
                "giving up (read logs/replay.log for why it is down)."
            )
        if waited - last_log >= log_every_s:
            last_log = waited
            ctx.log(
                f"replay at {address} unreachable; probe {probes}, waited {waited:.0f}s of at "
                f"most {timeout_s:.0f}s"
            )
        ctx.wait(1.0)
    ctx.log(f"asked to stop while waiting for the replay at {address}")
    return False


def reconnect_or_raise(ctx, address: str, error: BaseException, timeout_s: float) -> bool:
    """Decides what a failed replay call means: True to rebuild and retry, else re-raises.

    A connection error, or any error while the replay does not answer, is an outage:
    wait for the replay (bounded) and return True. Any other error is a real failure
    and propagates. Returns False when the node is stopping.
    """
    if ctx.should_stop():
        return False
    if not is_connection_error(error) and replay_reachable(address):
        raise error
    ctx.log(
        f"lost the replay at {address} ({type(error).__name__}: {str(error)[:160]}); "
        "waiting for it to come back"
    )
    return wait_for_replay(ctx, address, timeout_s)
