"""Node bodies of distributed D4PG: replay, learner, actor, evaluator.

Each is ``fn(ctx, **json_kwargs)`` and builds its part with `agents.d4pg.builder`;
the only address a node needs is the replay server's (transitions and weights both
travel through Reverb). TensorFlow, Reverb and dm-control are imported inside the
bodies so that the launcher itself stays light.

The replay may restart under its clients: it rebinds the port it had, and the
learner, actors and evaluator wait for it and rebuild their Reverb pieces
(`launch.d4pg.replay_link`), without a restart of their own.

Metrics each node reports (see `launch.runtime.metrics`):
  replay:    gauge replay_size; the bottleneck report (`launch.reporting.bottleneck`); TensorBoard
  learner:   gauge learner_steps; "learner" records with losses; TensorBoard scalars
  actor_i:   count actor_steps, episodes; gauge weights_version_actor_i
  evaluator: "eval" records (mean/std return, learner step evaluated); TensorBoard
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from launch.d4pg.replay_link import (
    is_connection_error,
    reconnect_or_raise,
    replay_reachable,
    wait_for_replay,
)
from launch.runtime.errors import NodeStartupError
from launch.runtime.run_dir import write_json_atomic

REPLAY_ADDRESS = "replay_address"
_CHECKPOINTS = "checkpoints"
_ADDRESS_FILE = "replay_address.json"  # In checkpoints/: the port a restarted replay rebinds.
RECONNECT_TIMEOUT_S = 600.0  # How long clients wait for a restarting replay before failing.
# The replay node's stop timeout (it asks for more once its checkpoints take longer).
REPLAY_STOP_TIMEOUT_S = 60.0
# After a stop request, how long an update may still run before it is cancelled (it is
# then waiting for a replay that does not answer).
STEP_CANCEL_GRACE_S = 5.0


def _config(config: dict[str, Any]):
    from agents.d4pg.config import D4PGConfig  # pylint: disable=import-outside-toplevel

    try:
        return D4PGConfig.from_dict(config)
    except (ValueError, TypeError, KeyError) as e:
        raise NodeStartupError(f"bad D4PG config: {e}") from None


def _previous_port(ctx) -> int | None:
    """The port this replay had before it was restarted in the same launch (None: none)."""
    if ctx.attempt == 0:
        return None  # A new launch: the configured port (or any free one).
    try:
        with open(ctx.path(_CHECKPOINTS, _ADDRESS_FILE), encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    return int(saved["port"]) if saved.get("host") == ctx.advertise_host else None


def _start_server(ctx, cfg, spec, port: int | None, directory: str):
    from agents.d4pg import builder  # pylint: disable=import-outside-toplevel

    previous = _previous_port(ctx)
    if previous:
        try:
            return builder.make_replay_server(cfg, spec, port=previous, checkpoint_dir=directory)
        except Exception as e:  # pylint: disable=broad-except
            ctx.log(f"cannot rebind port {previous} ({e}); taking a new one (clients restart)")
    return builder.make_replay_server(cfg, spec, port=port or None, checkpoint_dir=directory)


def _environment(config, task: str, seed: int):
    import environments  # pylint: disable=import-outside-toplevel
    from agents.d4pg import builder  # pylint: disable=import-outside-toplevel

    try:
        env = builder.make_environment(config, task, seed=seed)
    except environments.UnknownTaskError as e:
        raise NodeStartupError(str(e)) from None  # Every restart would fail the same way.
    return env, environments.make_environment_spec(env)


def replay(
    ctx,
    *,
    task: str,
    config: dict,
    port: int | None = None,
    checkpoint_every_s: float = 120.0,
    report_every_s: float = 5.0,
) -> None:
    """Serves the "replay" and "params" tables; checkpoints periodically and on stop.

    Starting with an existing checkpoint in RUN_DIR/checkpoints/replay restores it.
    """
    import reverb  # pylint: disable=import-outside-toplevel

    from agents.d4pg import replay as replay_lib  # pylint: disable=import-outside-toplevel
    from launch.reporting import bottleneck  # pylint: disable=import-outside-toplevel

    cfg = _config(config)
    _, spec = _environment(cfg, task, seed=cfg.seed)
    directory = ctx.path(_CHECKPOINTS, "replay", "")
    started = time.monotonic()
    server = _start_server(ctx, cfg, spec, port, directory)
    client = reverb.Client(f"localhost:{server.port}")
    size = replay_lib.transitions(replay_lib.table_size(client), cfg)
    ctx.log(
        f"serving on port {server.port} (all interfaces: a Reverb 0.14 limitation); "
        f"{size} transitions restored from {directory} in {time.monotonic() - started:.1f}s"
    )
    ctx.gauge(replay_size=size)
    address_file = ctx.path(_CHECKPOINTS, _ADDRESS_FILE)
    write_json_atomic(address_file, {"host": ctx.advertise_host, "port": server.port})
    ctx.publish(REPLAY_ADDRESS, f"{ctx.advertise_host}:{server.port}")

    def checkpoint(what: str) -> None:
        # Inserts go on while Reverb writes, so the saved size lies between the two.
        t0 = time.monotonic()
        before = replay_lib.transitions(replay_lib.table_size(client), cfg)
        path = client.checkpoint()
        after = replay_lib.transitions(replay_lib.table_size(client), cfg)
        seconds = time.monotonic() - t0
        # The final checkpoint must fit in the stop timeout: ask for twice the last one.
        ctx.need_stop_time(max(REPLAY_STOP_TIMEOUT_S, 2 * seconds + 10))
        ctx.gauge(replay_size=after)
        ctx.record("replay_checkpoint", size_before=before, size_after=after, seconds=seconds)
        ctx.log(f"{what} ({before}..{after} transitions, {seconds:.2f}s): {path}")

    last_checkpoint = time.monotonic()
    # Which side waits on the rate limiter: the bottleneck report (launch.reporting.bottleneck).
    monitor = bottleneck.LimiterMonitor(
        lambda: client.server_info()[replay_lib.REPLAY_TABLE],
        transitions_per_item=cfg.resolved_transitions_per_item(),
    ).start()
    writer = bottleneck.SummaryWriter(ctx.path("tensorboard", "replay", ""))
    try:
        while not ctx.wait(min(report_every_s, checkpoint_every_s)):
            report = monitor.report()
            ctx.gauge(
                replay_size=replay_lib.transitions(replay_lib.table_size(client), cfg), **report
            )
            writer.write(report)
            if time.monotonic() - last_checkpoint >= checkpoint_every_s:
                checkpoint("replay checkpoint")
                last_checkpoint = time.monotonic()
    finally:
        monitor.stop()
        checkpoint("final replay checkpoint")
        server.stop()


def learner(
    ctx,
    *,
    task: str,
    config: dict,
    replay_address: str,
    replicas: str = "cpu",
    checkpoint_every_steps: int = 10_000,
    checkpoint_every_s: float = 300.0,
    snapshot_every_s: float = 60.0,
    report_every_s: float = 5.0,
    keep_snapshots: int = 3,
    worker_index: int = 0,
    group_addresses: list[str] | None = None,
    intra_op_threads: int = 0,
) -> None:
    """Restores from RUN_DIR/checkpoints/learner if any, then updates until stopped.

    Weights are published to the replay server every `config.publish_period` updates
    (by the learner itself) and checkpointed every `checkpoint_every_steps` updates or
    `checkpoint_every_s` seconds, and on stop. A checkpoint at least `snapshot_every_s`
    after the last policy snapshot, and the one on stop, also write a snapshot
    RUN_DIR/snapshots/step_N, of which the `keep_snapshots` newest are kept. Snapshots
    are not written with every checkpoint because a SavedModel save traces the policy
    anew: ~0.3 s of CPU, which every 1,000 updates took 15-30% of the learner's time.

    With `group_addresses` (one per learner worker, set by the backend), this is worker
    `worker_index` of one multi-worker learner (`launch.runtime.learner_group`): every worker
    samples its own share of the global batch; worker 0, the chief, alone publishes
    weights, writes checkpoints and TensorBoard; the others only restore the chief's
    checkpoint and report their own metrics and log.
    """
    from launch.runtime import learner_group  # pylint: disable=import-outside-toplevel

    # First: thread pools, logical CPUs and the multi-worker runtime precede any TF op.
    if intra_op_threads:
        limit_intra_op_threads(ctx, intra_op_threads)
    repl = learner_group.make_replicator(replicas, group_addresses, worker_index)
    import reverb  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from agents.d4pg import builder  # pylint: disable=import-outside-toplevel
    from launch.d4pg import snapshots  # pylint: disable=import-outside-toplevel

    cfg = _config(config)
    _, spec = _environment(cfg, task, seed=cfg.seed)
    from agents.d4pg.learning import (  # pylint: disable=import-outside-toplevel
        ReplayTimeoutError,
        StepCancelledError,
    )

    workers = len(group_addresses or ()) or 1
    is_chief = worker_index == 0
    checkpoints = os.path.join(ctx.run_dir, _CHECKPOINTS, "learner", "")
    if is_chief:
        os.makedirs(checkpoints, exist_ok=True)
    if not wait_for_replay(ctx, replay_address, RECONNECT_TIMEOUT_S):
        return

    # A bounded wait for replay batches keeps the loop responsive to stop requests
    # while the rate limiter waits for actors. Workers of a group wait without bound:
    # one worker's timed-out sample would leave its peers inside an all-reduce.
    agent = builder.make_learner(
        cfg,
        spec,
        replay_address,
        repl,
        checkpoints,
        rate_limiter_timeout_ms=1000 if workers == 1 else -1,
        publish=is_chief,
        # The fresh initialisation is published only when there is nothing to restore:
        # published first, actors could pull it before the restored weights replace it.
        publish_initial=False,
    )
    restored = agent.restore()  # Publishes the restored weights (the chief).
    if is_chief and not restored:
        agent.publish_variables()
    steps = agent.num_steps
    role = f"worker {worker_index} of {workers}{' (chief)' if is_chief else ''}, " * (workers > 1)
    ctx.log(
        f"{'restored at' if restored else 'starting from'} step {steps} "
        f"with {repl.num_replicas} replica(s) ({role}{replicas}); replay at {replay_address}"
        + (f"; group {', '.join(group_addresses)}" if workers > 1 else "")
    )
    # Only the chief's step count is the run's; the others report their own key.
    steps_key = "learner_steps" if is_chief else f"learner_steps_{ctx.name}"
    ctx.gauge(**{steps_key: steps})
    writer = None
    if is_chief:
        writer = tf.summary.create_file_writer(ctx.path("tensorboard", "learner", ""))
    stop = learner_group.GroupStop(repl)
    last_report = last_save = last_snapshot = time.monotonic()
    steps_at_report = steps_at_save = steps
    metrics: dict[str, float] = {}

    def snapshot() -> None:
        snapshots.save_for_run(
            ctx.run_dir, learner=agent, config=cfg, env_spec=spec, task=task, keep=keep_snapshots
        )

    last_probe = time.monotonic()
    loop_done = threading.Event()
    _cancel_steps_blocked_at_stop(ctx, agent, loop_done)
    try:
        while not stop.should_stop(ctx.should_stop(), steps):
            try:
                metrics = agent.step()
            except StepCancelledError:
                break
            except ReplayTimeoutError:
                # Waiting for actors (or for min_replay_size)... or for a dead replay, or
                # for one that came back without the weights (none checkpointed yet).
                if time.monotonic() - last_probe >= 10.0:
                    last_probe = time.monotonic()
                    if not replay_reachable(replay_address):
                        _reconnect_learner(
                            ctx,
                            agent,
                            replay_address,
                            TimeoutError("replay unavailable"),
                            reverb,
                            publish=is_chief,
                        )
                    elif is_chief and _republish_if_missing(ctx, agent):
                        ctx.log(
                            f"the replay holds no weights (restarted without them); "
                            f"republished at step {agent.num_steps}"
                        )
                continue
            except Exception as e:  # pylint: disable=broad-except
                if workers > 1 and not ctx.should_stop():
                    # Workers reconnecting one by one would resume at different updates
                    # and wait in an all-reduce for ever: the group restarts as a whole,
                    # in lockstep, from the chief's checkpoint (`Node.group`).
                    ctx.log(
                        f"lost the replay or a peer ({type(e).__name__}: {str(e)[:160]}); "
                        "the learner group restarts from the last checkpoint"
                    )
                    raise
                if _reconnect_learner(ctx, agent, replay_address, e, reverb, publish=is_chief):
                    continue
                raise
            if workers > 1:
                # An update done: not stuck (the group's stall watchdog, `Node.stall_timeout`,
                # armed by the first one, so compiling the first update is not timed). One
                # learner has no watchdog: it would only rewrite its published values.
                ctx.heartbeat()
            steps = agent.num_steps
            now = time.monotonic()
            if now - last_report >= report_every_s:
                rate = (steps - steps_at_report) / (now - last_report)
                ctx.gauge(**{steps_key: steps})
                ctx.record("learner", learner_steps=steps, steps_per_s=rate, **metrics)
                if writer is not None:
                    with writer.as_default(step=steps):
                        for name, value in metrics.items():
                            tf.summary.scalar(f"learner/{name}", value)
                        tf.summary.scalar("learner/steps_per_second", rate)
                last_report, steps_at_report = now, steps
            if is_chief and (
                steps - steps_at_save >= checkpoint_every_steps
                or now - last_save >= checkpoint_every_s
            ):
                agent.save()
                if now - last_snapshot >= snapshot_every_s:
                    snapshot()
                    last_snapshot = now
                last_save, steps_at_save = now, steps
    except Exception as e:  # pylint: disable=broad-except
        # On shutdown the replay server may stop under a blocked sample: not a crash.
        if not ctx.should_stop() and not ctx.wait(1.0):
            raise
        ctx.log(f"update interrupted by shutdown ({type(e).__name__})")
    finally:
        loop_done.set()
    ctx.gauge(**{steps_key: agent.num_steps})
    if not is_chief:
        ctx.log(f"stopped at step {agent.num_steps} (the chief writes the checkpoint)")
        return
    path = agent.save()
    snapshot()
    writer.flush()
    ctx.log(f"final learner checkpoint at step {agent.num_steps}: {path}")


def limit_intra_op_threads(ctx, threads: int) -> None:
    """Lets one TensorFlow op of this process use at most `threads` threads, XLA's
    compiled computations included (`D4PGProgramSettings.learner_intra_op_threads`).

    Only possible before TensorFlow starts in the process: with the threads backend,
    where every node shares one process, TensorFlow keeps its default (logged).
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    except RuntimeError:
        ctx.log(
            f"TensorFlow already runs in this process: its ops keep their default "
            f"threads (learner_intra_op_threads={threads} not applied)"
        )


def _cancel_steps_blocked_at_stop(ctx, agent, loop_done: threading.Event) -> None:
    """Once a stop is asked, gives the update loop `STEP_CANCEL_GRACE_S` to end, then
    cancels the update it is blocked in, so the final checkpoint is still written.

    An update waits for its batch without a deadline while the replay does not answer
    (it stopped before the learner, as when every node of a dead launcher stops at once,
    or it is down or frozen); without this the learner would reach its stop deadline
    unsaved. A normal update ends within the sampling timeout (1 s) plus its compute.
    """

    def watch() -> None:
        while not ctx.wait(1.0):
            if loop_done.is_set():
                return
        if loop_done.wait(STEP_CANCEL_GRACE_S):
            return
        ctx.log(
            f"an update still waits for the replay {STEP_CANCEL_GRACE_S:.0f}s after the stop "
            "request: cancelling it to write the final checkpoint"
        )
        agent.cancel_steps()

    threading.Thread(target=watch, name="cancel-blocked-steps", daemon=True).start()


def _reconnect_learner(
    ctx, agent, address: str, error: BaseException, reverb, publish: bool = True
) -> bool:
    """After a replay outage: new dataset and client, weights republished at once.

    Only a publishing learner (the chief of a group) gets a client and republishes.
    """
    if not reconnect_or_raise(ctx, address, error, RECONNECT_TIMEOUT_S):
        return False
    agent.reconnect(reverb.Client(address) if publish else None)
    if publish:
        agent.publish_variables()
    ctx.log(f"reconnected to the replay at {address}; updates resume at step {agent.num_steps}")
    return True


def _republish_if_missing(ctx, agent) -> bool:
    """`agent.republish_if_missing()`, False when the replay went away meanwhile (the next
    probe reconnects)."""
    try:
        return agent.republish_if_missing()
    except Exception as e:  # pylint: disable=broad-except
        if not is_connection_error(e):
            raise
        ctx.log(f"could not check the replay's weights ({type(e).__name__}); retrying")
        return False


def _replay_back(ctx, address: str, error: BaseException) -> bool:
    """After an error of a replay client (actor, evaluator): True once the replay answers
    again (rebuild the Reverb pieces and go on), False if the node is stopping (the replay
    went away during shutdown). Raises `error` if it is not a lost replay, and
    `ReplayUnreachableError` if the replay stays away (`launch.d4pg.replay_link`)."""
    if ctx.should_stop() or ctx.wait(1.0):
        return False
    return reconnect_or_raise(ctx, address, error, RECONNECT_TIMEOUT_S)


def actor(
    ctx, *, task: str, config: dict, replay_address: str, index: int, envs_per_actor: int = 1
) -> None:
    """Runs noisy episodes, writing n-step transitions and pulling weights periodically.

    With `envs_per_actor` K > 1 this process steps K environments (seeds distinct per
    environment) with one batched policy call per step; see `_batched_actor`.
    """
    if envs_per_actor > 1:
        _batched_actor(ctx, task, config, replay_address, index, envs_per_actor)
        return
    from agents.d4pg import builder  # pylint: disable=import-outside-toplevel
    from agents.environment_loop import EnvironmentLoop  # pylint: disable=import-outside-toplevel

    cfg = _config(config)
    # Distinct streams per actor and per restart (a restart must not replay old episodes).
    seed = cfg.seed * 100_003 + 1000 * (index + 1) + ctx.attempt
    env, spec = _environment(cfg, task, seed=seed)
    if not wait_for_replay(ctx, replay_address, RECONNECT_TIMEOUT_S):
        return

    def make(stream: int) -> tuple[Any, Any]:
        agent = builder.make_actor(cfg, spec, replay_address, seed=stream)
        return agent, EnvironmentLoop(env, agent, label=ctx.name)

    ctx.log(f"acting in {task} (seed {seed}); replay at {replay_address}")
    _act_until_stopped(ctx, replay_address, seed, make, lambda loop: [loop.run_episode()])


def _act_until_stopped(
    ctx,
    replay_address: str,
    seed: int,
    make: Callable[[int], tuple[Any, Any]],
    run: Callable[[Any], list[dict]],
) -> None:
    """The acting loop of `actor` and `_batched_actor`: `run(loop)` plays until episodes
    end, each counted and recorded; `make(seed)` builds the (agent, loop) pair, again after
    the replay went away and came back (a new client, writers and variable client, with a
    fresh noise stream: the old one would repeat its episodes; cut episodes are dropped)."""
    agent, loop = make(seed)
    version_key = f"weights_version_{ctx.name}"
    reconnects = 0
    while not ctx.should_stop():
        try:
            results = run(loop)
        except Exception as e:  # pylint: disable=broad-except
            if not _replay_back(ctx, replay_address, e):
                return
            reconnects += 1
            agent, loop = make(seed + 7919 * reconnects)
            ctx.log(f"reconnected to the replay at {replay_address}; acting again")
            continue
        for result in results:
            ctx.count(actor_steps=result["episode_length"], episodes=1)
            ctx.record(
                "episode",
                episode_return=result["episode_return"],
                steps_per_s=result["steps_per_second"],
                weights_version=agent.weights_version,
                exploration_sigma=agent.sigma,
                **({"env_index": result["env_index"]} if "env_index" in result else {}),
            )
        ctx.gauge(**{version_key: agent.weights_version})


# Environment j > 0 of a batched actor adds j times this to the actor's seed: far apart
# from the seeds of other actors (1000 apart) and of restarts (+1 each).
_ENV_SEED_STRIDE = 10_000_019


def _batched_actor(
    ctx, task: str, config: dict, replay_address: str, index: int, num_envs: int
) -> None:
    """`actor` for K environments: episodes are counted and recorded one by one as above."""
    from agents.d4pg import builder  # pylint: disable=import-outside-toplevel
    from agents.environment_loop import (  # pylint: disable=import-outside-toplevel
        BatchedEnvironmentLoop,
    )

    cfg = _config(config)
    seed = cfg.seed * 100_003 + 1000 * (index + 1) + ctx.attempt
    seeds = [(seed + _ENV_SEED_STRIDE * j) % 2**31 for j in range(num_envs)]
    made = [_environment(cfg, task, seed=s) for s in seeds]
    envs, spec = [env for env, _ in made], made[0][1]
    if not wait_for_replay(ctx, replay_address, RECONNECT_TIMEOUT_S):
        return

    def make(stream: int) -> tuple[Any, Any]:
        agent = builder.make_batched_actor(
            cfg, spec, replay_address, seed=stream, num_envs=num_envs
        )
        return agent, BatchedEnvironmentLoop(envs, agent, label=ctx.name)

    ctx.log(f"acting in {num_envs} x {task} (seeds {seeds}); replay at {replay_address}")
    _act_until_stopped(ctx, replay_address, seed, make, lambda loop: loop.run_until_episode())


def evaluation_due(steps: int, steps_at_last: int | None, every_steps: int) -> bool:
    """Whether an evaluation is due at `steps` actor steps, the last one at `steps_at_last`.

    Due once per multiple of `every_steps` passed (and at the first look): evaluations
    stay on the grid 0, P, 2P, ... however long each takes, so runs and seeds are compared
    at the same actor steps. Counting P from the last evaluation instead drifts by the
    steps taken while it ran (a 10-episode evaluation every 10k steps ended at 192k, not
    200k, after 20). A replay restarted without its counters (`steps` below the last)
    makes one due at once.
    """
    if steps_at_last is None or steps < steps_at_last:
        return True
    return steps // every_steps > steps_at_last // every_steps


def evaluator(
    ctx,
    *,
    task: str,
    config: dict,
    replay_address: str,
    episodes: int = 5,
    every_s: float = 30.0,
    every_steps: int | None = None,
) -> None:
    """Runs noise-free episodes with the latest weights, every `every_steps` actor steps
    (when set) or else every `every_s` seconds.

    Actor steps are read from the replay table's rate limiter: actors write exactly one
    n-step transition per environment step, so the transitions inserted (items times
    `transitions_per_item`) are the run's actor step count (restored with the replay
    checkpoint; only its increase is used here). With G > 1 per item the count lags by
    the transitions actors still pool or hold for one write (at most `item_pool_size` +
    `items_per_write` x G each, half an episode at the defaults' 256 + 16 x 16).
    With `short_transitions_from_first_state` every episode inserts n - 1 more (Acme's
    short transitions from o_0), so the count runs ahead of actor steps by (n - 1) / T
    for episodes of T steps (0.4% for dm-control's 1000 steps at n = 5) and evaluations
    come that much early.
    """
    import numpy as np  # pylint: disable=import-outside-toplevel
    import reverb  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from agents.d4pg import builder  # pylint: disable=import-outside-toplevel
    from agents.d4pg.replay import REPLAY_TABLE  # pylint: disable=import-outside-toplevel
    from agents.environment_loop import EnvironmentLoop  # pylint: disable=import-outside-toplevel
    from launch.reporting import bottleneck  # pylint: disable=import-outside-toplevel

    cfg = _config(config)
    seed = cfg.seed * 100_003 + 7 + ctx.attempt
    env, spec = _environment(cfg, task, seed=seed)
    if not wait_for_replay(ctx, replay_address, RECONNECT_TIMEOUT_S):
        return
    agent = builder.make_evaluator(cfg, spec, replay_address, seed=seed)
    loop = EnvironmentLoop(env, agent, should_update=False, label=ctx.name)
    writer = tf.summary.create_file_writer(ctx.path("tensorboard", "evaluator", ""))
    client = reverb.Client(replay_address)

    def actor_steps() -> int:
        info = client.server_info(timeout=10)  # Raises, not hangs, on a replay gone away.
        state = bottleneck.LimiterState.from_table_info(info[REPLAY_TABLE])
        return state.inserts * cfg.resolved_transitions_per_item()

    evaluated = None
    steps_at_eval: int | None = None
    while not ctx.should_stop():
        try:
            steps = actor_steps() if every_steps else None
            due = not every_steps or evaluation_due(steps, steps_at_eval, every_steps)
            if due:
                agent.update(wait=True)
            if due and agent.weights_version != evaluated:
                evaluated = agent.weights_version
                steps_at_eval = steps
                returns = [loop.run_episode()["episode_return"] for _ in range(episodes)]
                mean, std = float(np.mean(returns)), float(np.std(returns))
                ctx.record(
                    "eval",
                    **{
                        "return": mean,
                        "return_std": std,
                        "episodes": episodes,
                        "learner_steps": evaluated,
                        # Actor steps (transitions inserted) that made this evaluation due.
                        "replay_inserts": steps,
                    },
                )
                ctx.log(f"eval at learner step {evaluated}: return {mean:.1f} +- {std:.1f}")
                with writer.as_default(step=max(evaluated, 0)):
                    tf.summary.scalar("eval/return", mean)
                    tf.summary.scalar("eval/return_std", std)
                writer.flush()
        except Exception as e:  # pylint: disable=broad-except
            if not _replay_back(ctx, replay_address, e):
                return
            agent = builder.make_evaluator(cfg, spec, replay_address, seed=seed)
            loop = EnvironmentLoop(env, agent, should_update=False, label=ctx.name)
            client = reverb.Client(replay_address)
            ctx.log(f"reconnected to the replay at {replay_address}")
            continue
        ctx.wait(every_s if not every_steps else 0.5)
