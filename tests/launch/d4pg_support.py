"""Shared pieces of the D4PG launch tests: a tiny config and metrics readers."""

import json
import os
import threading
import time

from launch.d4pg import program as d4pg_program
from launch.runtime import launcher

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASK = "cartpole:balance"

# Tiny networks and short episodes (action_repeat 5: 200 agent steps per episode) so
# that everything happens within seconds on 2 loaded cores.
TINY = {
    "policy_layers": "16,16",
    "critic_layers": "16,16",
    "num_atoms": "11",
    "batch_size": "16",
    "min_replay_size": "100",
    "samples_per_insert": "4",
    "variable_update_period": "50",
    "publish_period": "5",
    "action_repeat": "5",
    "prefetch_size": "1",
    "max_in_flight_samples_per_worker": "32",
}
TINY_FLAGS = [f"--config.{k}={v}" for k, v in TINY.items()]


def tiny_config() -> dict:
    from agents.d4pg.config import D4PGConfig

    return D4PGConfig.from_overrides(TINY).to_dict()


def tiny_program(
    num_actors=2, replicas="cpu", checkpoint_every_steps=50, config=None, **settings_kwargs
):
    """A tiny D4PG program; `config` overrides keys of `tiny_config()`."""
    settings = d4pg_program.D4PGProgramSettings(
        task=TASK,
        num_actors=num_actors,
        learner_replicas=replicas,
        learner_checkpoint_every_steps=checkpoint_every_steps,
        eval_every_s=3.0,
        eval_episodes=1,
        report_every_s=1.0,
        **settings_kwargs,
    )
    return d4pg_program.make_program(settings, {**tiny_config(), **(config or {})})


def records(run_dir, node=None, kind=None):
    """All metrics records (optionally of one node and kind), in file order."""
    out = []
    metrics = os.path.join(run_dir, "metrics")
    if not os.path.isdir(metrics):
        return out
    for name in sorted(os.listdir(metrics)):
        if node is not None and name != f"{node}.jsonl":
            continue
        with open(os.path.join(metrics, name)) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if kind is None or r.get("kind") == kind:
                    out.append(r)
    return out


def gauge(run_dir, key, node=None):
    """Latest value of a gauge (None if never reported)."""
    values = [r[key] for r in records(run_dir, node, "gauge") if key in r]
    return values[-1] if values else None


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def log_text(run_dir, node):
    with open(os.path.join(run_dir, "logs", f"{node}.log"), errors="replace") as f:
        return f.read()


def assert_final_saves_after(run_dir, offsets, killed_at):
    """The learner and the replay logged their final checkpoints after the log `offsets`
    (chars per node) and wrote them at or after `killed_at`; returns both logs' new parts."""
    learner = log_text(run_dir, "learner")[offsets["learner"] :]
    replay = log_text(run_dir, "replay")[offsets["replay"] :]
    assert "final learner checkpoint" in learner, learner
    assert "final replay checkpoint" in replay, replay
    index = os.path.join(run_dir, "checkpoints", "learner", "checkpoint")
    assert os.path.getmtime(index) >= killed_at
    replay_root = os.path.join(run_dir, "checkpoints", "replay")
    replay_dirs = [os.path.join(replay_root, d) for d in os.listdir(replay_root)]
    assert max(os.path.getmtime(d) for d in replay_dirs) >= killed_at
    return learner, replay


# Every `Background` started, so that a test that fails before its `stop()` does not leave
# its nodes running into the next tests of the same worker (`stop_all_running`).
_STARTED: list["Background"] = []


class Background:
    """Runs `launcher.run` in a thread and gives access to its supervisor."""

    def __init__(self, program, run_dir, backend="local", **kwargs):
        self.result = {}
        holder = {}
        _STARTED.append(self)

        def target():
            self.result["outcome"] = launcher.run(
                program,
                run_dir,
                backend,
                progress_every=0,
                on_supervisor=lambda s: holder.setdefault("sup", s),
                **kwargs,
            )

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()
        self.supervisor = wait_for(lambda: holder.get("sup"), 60, "the supervisor")

    def stop(self, timeout=90):
        self.supervisor.request_stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the launcher did not stop"
        return self.result["outcome"]


def stop_all_running(timeout: float = 90) -> None:
    """Stops every `Background` whose launcher still runs (a test failed before its stop)."""
    while _STARTED:
        background = _STARTED.pop()
        supervisor = getattr(background, "supervisor", None)
        if background.thread.is_alive() and supervisor is not None:
            supervisor.request_stop()
            background.thread.join(timeout)
