"""Node bodies of distributed D4PG: replay, learner, actor, evaluator.

Each is ``fn(ctx, **json_kwargs)`` and builds its part with `agents.d4pg.builder`;
the only address a node needs is the replay server's (transitions and weights both
travel through Reverb). TensorFlow, Reverb and dm-control are imported inside the
bodies so that the launcher itself stays light.

The replay may restart under its clients: it rebinds the port it had, and the
learner, actors and evaluator wait for it and rebuild their Reverb pieces
(`launch.replay_link`), without a restart of their own.

Metrics each node reports (see `launch.metrics`):
  replay:    gauge replay_size
  learner:   gauge learner_steps; "learner" records with losses; TensorBoard scalars
  actor_i:   count actor_steps, episodes; gauge weights_version_actor_i
  evaluator: "eval" records (mean/std return, learner step evaluated); TensorBoard
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from launch.errors import NodeStartupError
from launch.replay_link import reconnect_or_raise, replay_reachable, wait_for_replay

REPLAY_ADDRESS = "replay_address"
_CHECKPOINTS = "checkpoints"
_ADDRESS_FILE = "replay_address.json"  # In checkpoints/: the port a restarted replay rebinds.
RECONNECT_TIMEOUT_S = 600.0  # How long clients wait for a restarting replay before failing.


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

    cfg = _config(config)
    _, spec = _environment(cfg, task, seed=cfg.seed)
    directory = ctx.path(_CHECKPOINTS, "replay", "")
    started = time.monotonic()
    server = _start_server(ctx, cfg, spec, port, directory)
    client = reverb.Client(f"localhost:{server.port}")
    size = replay_lib.table_size(client)
    ctx.log(
        f"serving on port {server.port} (all interfaces: a Reverb 0.14 limitation); "
        f"{size} transitions restored from {directory} in {time.monotonic() - started:.1f}s"
    )
    ctx.gauge(replay_size=size)
    address_file = ctx.path(_CHECKPOINTS, _ADDRESS_FILE)
    with open(address_file + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"host": ctx.advertise_host, "port": server.port}, f)
    os.replace(address_file + ".tmp", address_file)
    ctx.publish(REPLAY_ADDRESS, f"{ctx.advertise_host}:{server.port}")

    def checkpoint(what: str) -> None:
        # Inserts go on while Reverb writes, so the saved size lies between the two.
        t0 = time.monotonic()
        before = replay_lib.table_size(client)
        path = client.checkpoint()
        after = replay_lib.table_size(client)
        seconds = time.monotonic() - t0
        ctx.gauge(replay_size=after)
        ctx.record("replay_checkpoint", size_before=before, size_after=after, seconds=seconds)
        ctx.log(f"{what} ({before}..{after} transitions, {seconds:.2f}s): {path}")

    last_checkpoint = time.monotonic()
    try:
        while not ctx.wait(min(report_every_s, checkpoint_every_s)):
            ctx.gauge(replay_size=replay_lib.table_size(client))
            if time.monotonic() - last_checkpoint >= checkpoint_every_s:
                checkpoint("replay checkpoint")
                last_checkpoint = time.monotonic()
    finally:
        checkpoint("final replay checkpoint")
        server.stop()


def learner(
    ctx,
    *,
    task: str,
    config: dict,
    replay_address: str,
    replicas: str = "cpu",
    checkpoint_every_steps: int = 1000,
    checkpoint_every_s: float = 300.0,
    report_every_s: float = 5.0,
) -> None:
    """Restores from RUN_DIR/checkpoints/learner if any, then updates until stopped.

    Weights are published to the replay server every `config.publish_period` updates
    (by the learner itself) and checkpointed every `checkpoint_every_steps` updates or
    `checkpoint_every_s` seconds, and on stop.
    """
    import replication  # pylint: disable=import-outside-toplevel

    repl = replication.make(replicas)  # First: logical CPUs must precede any TF op.
    import reverb  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from agents.d4pg import builder  # pylint: disable=import-outside-toplevel

    cfg = _config(config)
    _, spec = _environment(cfg, task, seed=cfg.seed)
    from agents.d4pg.learning import ReplayTimeoutError  # pylint: disable=import-outside-toplevel

    if not wait_for_replay(ctx, replay_address, RECONNECT_TIMEOUT_S):
        return

    # A bounded wait for replay batches keeps the loop responsive to stop requests
    # while the rate limiter waits for actors.
    agent = builder.make_learner(
        cfg,
        spec,
        replay_address,
        repl,
        ctx.path(_CHECKPOINTS, "learner", ""),
        rate_limiter_timeout_ms=1000,
    )
    restored = agent.restore()
    steps = agent.num_steps
    ctx.log(
        f"{'restored at' if restored else 'starting from'} step {steps} "
        f"with {repl.num_replicas} replica(s) ({replicas}); replay at {replay_address}"
    )
    ctx.gauge(learner_steps=steps)
    writer = tf.summary.create_file_writer(ctx.path("tensorboard", "learner", ""))
    last_report = last_save = time.monotonic()
    steps_at_report = steps_at_save = steps
    metrics: dict[str, float] = {}
    last_probe = time.monotonic()
    try:
        while not ctx.should_stop():
            try:
                metrics = agent.step()
            except ReplayTimeoutError:
                # Waiting for actors (or for min_replay_size)... or for a dead replay.
                if time.monotonic() - last_probe >= 10.0:
                    last_probe = time.monotonic()
                    if not replay_reachable(replay_address) and _reconnect_learner(
                        ctx, agent, replay_address, TimeoutError("replay unavailable"), reverb
                    ):
                        continue
                continue
            except Exception as e:  # pylint: disable=broad-except
                if _reconnect_learner(ctx, agent, replay_address, e, reverb):
                    continue
                raise
            steps = agent.num_steps
            now = time.monotonic()
            if now - last_report >= report_every_s:
                rate = (steps - steps_at_report) / (now - last_report)
                ctx.gauge(learner_steps=steps)
                ctx.record("learner", learner_steps=steps, steps_per_s=rate, **metrics)
                with writer.as_default(step=steps):
                    for name, value in metrics.items():
                        tf.summary.scalar(f"learner/{name}", value)
                    tf.summary.scalar("learner/steps_per_second", rate)
                last_report, steps_at_report = now, steps
            if (
                steps - steps_at_save >= checkpoint_every_steps
                or now - last_save >= checkpoint_every_s
            ):
                agent.save()
                last_save, steps_at_save = now, steps
    except Exception as e:  # pylint: disable=broad-except
        # On shutdown the replay server may stop under a blocked sample: not a crash.
        if not ctx.should_stop() and not ctx.wait(1.0):
            raise
        ctx.log(f"update interrupted by shutdown ({type(e).__name__})")
    path = agent.save()
    ctx.gauge(learner_steps=agent.num_steps)
    writer.flush()
    ctx.log(f"final learner checkpoint at step {agent.num_steps}: {path}")


def _reconnect_learner(ctx, agent, address: str, error: BaseException, reverb) -> bool:
    """After a replay outage: new dataset and client, weights republished at once."""
    if not reconnect_or_raise(ctx, address, error, RECONNECT_TIMEOUT_S):
        return False
    agent.reconnect(reverb.Client(address))
    agent.publish_variables()
    ctx.log(f"reconnected to the replay at {address}; updates resume at step {agent.num_steps}")
    return True


def actor(ctx, *, task: str, config: dict, replay_address: str, index: int) -> None:
    """Runs noisy episodes, writing n-step transitions and pulling weights periodically."""
    from agents.d4pg import builder  # pylint: disable=import-outside-toplevel
    from agents.environment_loop import EnvironmentLoop  # pylint: disable=import-outside-toplevel

    cfg = _config(config)
    # Distinct streams per actor and per restart (a restart must not replay old episodes).
    seed = cfg.seed * 100_003 + 1000 * (index + 1) + ctx.attempt
    env, spec = _environment(cfg, task, seed=seed)
    if not wait_for_replay(ctx, replay_address, RECONNECT_TIMEOUT_S):
        return
    agent = builder.make_actor(cfg, spec, replay_address, seed=seed)
    loop = EnvironmentLoop(env, agent, label=ctx.name)
    version_key = f"weights_version_{ctx.name}"
    ctx.log(f"acting in {task} (seed {seed}); replay at {replay_address}")
    reconnects = 0
    while not ctx.should_stop():
        try:
            result = loop.run_episode()
        except Exception as e:  # pylint: disable=broad-except
            if ctx.should_stop() or ctx.wait(1.0):
                return  # The replay server went away during shutdown.
            if not reconnect_or_raise(ctx, replay_address, e, RECONNECT_TIMEOUT_S):
                return
            # A new client, writer and variable client; the cut episode is dropped.
            reconnects += 1  # A fresh noise stream: the old one would repeat its episodes.
            agent = builder.make_actor(cfg, spec, replay_address, seed=seed + 7919 * reconnects)
            loop = EnvironmentLoop(env, agent, label=ctx.name)
            ctx.log(f"reconnected to the replay at {replay_address}; acting again")
            continue
        ctx.count(actor_steps=result["episode_length"], episodes=1)
        ctx.gauge(**{version_key: agent.weights_version})
        ctx.record(
            "episode",
            episode_return=result["episode_return"],
            steps_per_s=result["steps_per_second"],
            weights_version=agent.weights_version,
        )


def evaluator(
    ctx, *, task: str, config: dict, replay_address: str, episodes: int = 5, every_s: float = 30.0
) -> None:
    """Every `every_s` seconds, runs noise-free episodes with the latest weights."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from agents.d4pg import builder  # pylint: disable=import-outside-toplevel
    from agents.environment_loop import EnvironmentLoop  # pylint: disable=import-outside-toplevel

    cfg = _config(config)
    seed = cfg.seed * 100_003 + 7 + ctx.attempt
    env, spec = _environment(cfg, task, seed=seed)
    if not wait_for_replay(ctx, replay_address, RECONNECT_TIMEOUT_S):
        return
    agent = builder.make_evaluator(cfg, spec, replay_address, seed=seed)
    loop = EnvironmentLoop(env, agent, should_update=False, label=ctx.name)
    writer = tf.summary.create_file_writer(ctx.path("tensorboard", "evaluator", ""))
    evaluated = None
    while not ctx.should_stop():
        try:
            agent.update(wait=True)
            if agent.weights_version != evaluated:
                evaluated = agent.weights_version
                returns = [loop.run_episode()["episode_return"] for _ in range(episodes)]
                mean, std = float(np.mean(returns)), float(np.std(returns))
                ctx.record(
                    "eval",
                    **{
                        "return": mean,
                        "return_std": std,
                        "episodes": episodes,
                        "learner_steps": evaluated,
                    },
                )
                ctx.log(f"eval at learner step {evaluated}: return {mean:.1f} +- {std:.1f}")
                with writer.as_default(step=max(evaluated, 0)):
                    tf.summary.scalar("eval/return", mean)
                    tf.summary.scalar("eval/return_std", std)
                writer.flush()
        except Exception as e:  # pylint: disable=broad-except
            if ctx.should_stop() or ctx.wait(1.0):
                return
            if not reconnect_or_raise(ctx, replay_address, e, RECONNECT_TIMEOUT_S):
                return
            agent = builder.make_evaluator(cfg, spec, replay_address, seed=seed)
            loop = EnvironmentLoop(env, agent, should_update=False, label=ctx.name)
            ctx.log(f"reconnected to the replay at {replay_address}")
            continue
        ctx.wait(every_s)
