"""D4PG in one process: replay server, learner thread, actors and evaluator.

For debugging, tests and small machines. The learner runs in a background thread; the
actors (interleaved step by step) and the evaluator run in the calling thread. The
replay table's SampleToInsertRatio rate limiter paces both sides exactly as it does in
the distributed program: inserts block when the learner falls behind, sampling blocks
when the actors do.

Example:
  results = run_single_process(D4PGConfig(), "cartpole:balance", num_actor_steps=50_000,
                               eval_every=10_000)
  print(results.eval_returns)
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

import numpy as np

import replication
from agents.d4pg import builder
from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import ReplayTimeoutError
from agents.environment_loop import EnvironmentLoop

_log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunResults:
    """What a single-process run did.

    eval_returns: (actor steps, mean evaluation return) after each evaluation.
    train_returns: (actor steps, episode return) of every training episode.
    """

    eval_returns: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    train_returns: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    actor_steps: int = 0
    learner_steps: int = 0
    wall_seconds: float = 0.0
    reached_target: bool = False
    seconds_to_target: float | None = None
    steps_to_target: int | None = None
    learner_error: str | None = None

    @property
    def final_eval_return(self) -> float | None:
        return self.eval_returns[-1][1] if self.eval_returns else None


class _LearnerThread(threading.Thread):
    """Calls `learner.step()` until stopped (sampling blocks while actors lag)."""

    def __init__(self, learner, logger: Callable[[dict], None] | None, log_every: int):
        super().__init__(name="d4pg-learner", daemon=True)
        self.learner = learner
        self._logger = logger
        self._log_every = log_every
        self.stop_requested = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            logged = self.learner.num_steps
            while not self.stop_requested.is_set():
                try:
                    metrics = self.learner.step()
                except ReplayTimeoutError:
                    continue  # Actors are evaluating or slow; check for a stop request.
                # A step may run several updates: log when it crosses a multiple of log_every.
                steps = self.learner.num_steps
                if (
                    self._logger is not None
                    and steps // self._log_every > logged // self._log_every
                ):
                    logged = steps
                    self._logger(
                        {"label": "learner", "learner_steps": self.learner.num_steps, **metrics}
                    )
        except BaseException as e:  # pylint: disable=broad-except
            if not self.stop_requested.is_set():
                self.error = e
                _log.exception("D4PG learner thread failed")


def run_single_process(
    config: D4PGConfig,
    env_name: str,
    num_actor_steps: int,
    eval_every: int,
    *,
    eval_episodes: int = 1,
    num_actors: int = 1,
    replication_spec: str = "cpu",
    replicator: replication.Replicator | None = None,
    target_return: float | None = None,
    max_seconds: float | None = None,
    checkpoint_dir: str | None = None,
    logger: Callable[[dict], None] | None = None,
    learner_log_every: int = 1000,
) -> RunResults:
    """Trains D4PG on `env_name` for `num_actor_steps` actor steps, evaluating periodically.

    Args:
      config: hyperparameters (`config.seed` seeds environments, noise and networks).
      env_name: a dm-control task, e.g. "cartpole:balance".
      num_actor_steps: total environment steps over all actors (whole episodes).
      eval_every: evaluate (noise-free policy, `eval_episodes` episodes) each time this
        many more actor steps were taken, and once at the end.
      num_actors: actors interleaved step by step in this thread, each with its own
        environment and noise seed.
      replication_spec / replicator: the learner's replication (a given `replicator` wins).
      target_return: stop early once an evaluation reaches it.
      max_seconds: stop (after the current episode) once this much wall time has passed.
      checkpoint_dir: learner checkpoints (saved at the end).
      logger: receives dicts of episode results (label "actor"/"evaluator") and learner
        metrics (label "learner").

    Returns:
      `RunResults`.
    """
    start = time.perf_counter()
    if replicator is None:
        replicator = replication.make(replication_spec)
    config = config.with_pinned_layout(replicator.num_replicas)
    eval_env = builder.make_environment(config, env_name, seed=config.seed + 10_000)
    import environments  # After the replicator: its devices must be set up first.

    env_spec = environments.make_environment_spec(eval_env)

    server = builder.make_replay_server(config, env_spec)
    address = f"localhost:{server.port}"
    # A sampling timeout lets the learner thread notice a stop request while it waits.
    learner = builder.make_learner(
        config, env_spec, address, replicator, checkpoint_dir, rate_limiter_timeout_ms=500
    )
    evaluator = builder.make_evaluator(config, env_spec, address, seed=config.seed)
    eval_loop = EnvironmentLoop(
        eval_env, evaluator, logger=logger, should_update=False, label="evaluator"
    )
    loops = []
    for i in range(num_actors):
        env = builder.make_environment(config, env_name, seed=config.seed + i)
        actor = builder.make_actor(config, env_spec, address, seed=config.seed + 1000 + i)
        loops.append(_SteppedLoop(env, actor, label=f"actor_{i}"))

    results = RunResults()
    learner_thread = _LearnerThread(learner, logger, learner_log_every)
    learner_thread.start()
    next_eval = eval_every
    try:
        while results.actor_steps < num_actor_steps:
            for loop in loops:
                finished = loop.step()
                results.actor_steps += 1
                if finished is not None:
                    results.train_returns.append((results.actor_steps, finished["episode_return"]))
                    if logger is not None:
                        logger({**finished, "total_steps": results.actor_steps})
            if learner_thread.error is not None:
                raise RuntimeError("The learner thread failed") from learner_thread.error
            last = results.actor_steps >= num_actor_steps
            if results.actor_steps >= next_eval or last:
                next_eval += eval_every
                evaluator.update(wait=True)
                returns = [eval_loop.run_episode()["episode_return"] for _ in range(eval_episodes)]
                mean_return = float(np.mean(returns))
                results.eval_returns.append((results.actor_steps, mean_return))
                if logger is not None:
                    logger(
                        {
                            "label": "evaluation",
                            "actor_steps": results.actor_steps,
                            "learner_steps": learner.num_steps,
                            "mean_return": mean_return,
                            "weights_version": evaluator.weights_version,
                            "seconds": time.perf_counter() - start,
                        }
                    )
                if target_return is not None and mean_return >= target_return:
                    results.reached_target = True
                    results.seconds_to_target = time.perf_counter() - start
                    results.steps_to_target = results.actor_steps
                    break
            if max_seconds is not None and time.perf_counter() - start > max_seconds:
                break
    finally:
        learner_thread.stop_requested.set()
        learner_thread.join(timeout=60)
        server.stop()
        results.learner_steps = learner.num_steps
        if learner_thread.error is not None:
            results.learner_error = repr(learner_thread.error)
    if checkpoint_dir is not None:
        learner.save()
    results.wall_seconds = time.perf_counter() - start
    return results


class _SteppedLoop:
    """An environment loop advanced one step at a time (to interleave several actors)."""

    def __init__(self, env, actor, label: str):
        self._env, self._actor, self._label = env, actor, label
        self._timestep = None
        self._return = 0.0
        self._length = 0
        self._start = 0.0

    def step(self) -> dict | None:
        """Takes one step; returns the episode report when an episode ended."""
        if self._timestep is None or self._timestep.last():
            self._timestep = self._env.reset()
            self._actor.observe_first(self._timestep)
            self._return, self._length, self._start = 0.0, 0, time.perf_counter()
        action = self._actor.select_action(self._timestep.observation)
        self._timestep = self._env.step(action)
        self._actor.observe(action, self._timestep)
        self._actor.update()
        self._return += float(self._timestep.reward or 0.0)
        self._length += 1
        if self._timestep.last():
            return {
                "label": self._label,
                "episode_return": self._return,
                "episode_length": self._length,
                "steps_per_second": self._length / max(time.perf_counter() - self._start, 1e-9),
            }
        return None
