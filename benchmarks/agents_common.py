"""Helpers shared by the agents_* benchmarks: a replay server in its own process, results."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("MUJOCO_GL", "egl")
    return env


def fill_random_episodes(config, address: str, task: str, episodes: int) -> None:
    """Random-action episodes of `task` into the replay at `address` through the builder's
    adders, so the items have `config`'s layout (transitions per item). Publishes initial
    weights first: the actor waits for them. Unflushed items arrive while learners
    compile; they need min_replay_size only."""
    import numpy as np
    import reverb

    import environments
    from agents.d4pg import builder, networks, variables

    env = environments.make(task, seed=0)
    spec = environments.make_environment_spec(env)
    variables.publish(
        reverb.Client(address),
        0,
        [v.numpy() for v in networks.make_networks(config, spec).acting_variables()],
    )
    actor = builder.make_actor(config, spec, address, seed=3)
    rng = np.random.default_rng(0)
    for _ in range(episodes):
        timestep = env.reset()
        actor.observe_first(timestep)
        while not timestep.last():
            action = rng.uniform(-1, 1, spec.actions.shape).astype(np.float32)
            timestep = env.step(action)
            actor.observe(action, timestep)


_SERVE = r"""
import json, sys, time
from agents.d4pg.config import D4PGConfig
from agents.d4pg.replay import make_replay_server
import environments
config = D4PGConfig.from_json(sys.argv[1])
from agents.d4pg import builder
env = builder.make_environment(config, sys.argv[2], seed=0)
spec = environments.make_environment_spec(env)
del env
server = make_replay_server(config, spec, port=int(sys.argv[3]))
print("READY", flush=True)
sys.stdin.read()  # Serve until the parent closes our stdin (or dies).
server.stop()
"""


class ReplayServerProcess:
    """A D4PG replay server in a child process (so its memory and CPU are its own)."""

    def __init__(self, config, env_name: str):
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVE, config.to_json(), env_name, str(self.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=child_env(),
            text=True,
        )
        deadline = time.time() + 180
        while time.time() < deadline:
            line = self.process.stdout.readline()
            if line.strip() == "READY":
                break
            if not line and self.process.poll() is not None:
                raise RuntimeError("replay server process exited before it was ready")
        else:
            self.close()
            raise RuntimeError("replay server process did not start within 180 s")
        self.address = f"localhost:{self.port}"

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("VmRSS not found")

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=30)
            except Exception:  # pylint: disable=broad-except
                self.process.kill()
                self.process.wait(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def fixed_batch_input_fn(config, obs_dim: int, act_dim: int, seed: int = 0):
    """A learner input_fn repeating one random feature batch: the in-memory baseline.

    The learner's cost on it is the update alone, with no sampling, so a Reverb-fed rate
    divided by this one is what the replay costs.
    """
    import numpy as np
    import tensorflow as tf

    from agents.d4pg.learning import Transition

    rng = np.random.default_rng(seed)

    def input_fn(ctx):
        b = ctx.get_per_replica_batch_size(config.batch_size)
        data = Transition(
            rng.normal(size=(b, obs_dim)).astype(np.float32),
            rng.uniform(-1, 1, (b, act_dim)).astype(np.float32),
            rng.normal(size=b).astype(np.float32),
            np.full(b, 0.95, np.float32),
            rng.normal(size=(b, obs_dim)).astype(np.float32),
        )
        return tf.data.Dataset.from_tensors(data).repeat()

    return input_fn


def rotated(names: list, round_index: int) -> list:
    """`names` rotated left by `round_index`: each round of a benchmark starts with the next
    configuration, so none is always measured first (or last) after the others."""
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def machine_note() -> dict:
    load = os.getloadavg()
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_1_5_15": [round(x, 2) for x in load],
        "note": "2-core machine shared with other engineers' TensorFlow jobs; timings are "
        "noisy (see load average).",
    }


def write_result(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    result = {**result, "machine": machine_note(), "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")}
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}")
    return path
