"""Actor steps/s over raw env.step steps/s on cartpole:swingup features (target >= 0.7).

The actor does everything a distributed D4PG actor does: numpy policy (default 256x3
layers), Gaussian noise, the n-step adder into a real Reverb server running in another
process, and weight pulls from its "params" table every `variable_update_period` steps.
Raw and actor blocks alternate in the same run, so machine load affects both alike; the
ratio of the medians of wall-clock steps/s is the result. The ratio of this thread's CPU
time per step (time.thread_time) is printed too: it is insensitive to other processes
competing for the cores.

The replay table has no sample/insert rate limiting here (no learner samples from it),
so the measurement is of the actor, not of a learner's pace.

Usage: .venv/bin/python benchmarks/agents_actor_throughput.py [--steps 5000 --rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # The repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent))  # agents_common.

import numpy as np  # noqa: E402

from agents_common import ReplayServerProcess, write_result  # noqa: E402

TASK = "cartpole:swingup"


def raw_steps_per_second(env, steps: int) -> tuple[float, float]:
  """(wall-clock steps/s, thread-CPU steps/s) of env.step alone (resets included)."""
  action = np.zeros(env.action_spec().shape, np.float32)
  timestep = env.reset()
  start, cpu = time.perf_counter(), time.thread_time()
  for _ in range(steps):
    if timestep.last():
      timestep = env.reset()
    timestep = env.step(action)
  return steps / (time.perf_counter() - start), steps / (time.thread_time() - cpu)


def actor_steps_per_second(env, actor, steps: int) -> tuple[float, float]:
  """The same for a full actor step: act (policy + noise), env.step, add, maybe pull."""
  timestep = env.reset()
  actor.observe_first(timestep)
  start, cpu = time.perf_counter(), time.thread_time()
  for _ in range(steps):
    if timestep.last():
      timestep = env.reset()
      actor.observe_first(timestep)
    action = actor.select_action(timestep.observation)
    timestep = env.step(action)
    actor.observe(action, timestep)
    actor.update()
  return steps / (time.perf_counter() - start), steps / (time.thread_time() - cpu)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=2000, help="steps per block")
  parser.add_argument("--rounds", type=int, default=10, help="raw/actor block pairs")
  args = parser.parse_args()

  import environments
  import reverb
  from agents.d4pg import builder, networks, variables
  from agents.d4pg.config import D4PGConfig

  config = D4PGConfig.from_overrides({"samples_per_insert": 0, "min_replay_size": 1})
  env = environments.make(TASK, seed=0)
  spec = environments.make_environment_spec(env)
  with ReplayServerProcess(config, TASK) as server:
    nets = networks.make_networks(config, spec)  # Published once, like a learner would.
    variables.publish(reverb.Client(server.address), 0,
                      [v.numpy() for v in nets.acting_variables()])
    actor = builder.make_actor(config, spec, server.address, seed=1)
    actor_env = environments.make(TASK, seed=1)
    actor_steps_per_second(actor_env, actor, 500)  # Warm-up (first pull, writer setup).
    raw_env = environments.make(TASK, seed=2)
    raw, acting, raw_cpu, acting_cpu = [], [], [], []
    for _ in range(args.rounds):
      wall, cpu = raw_steps_per_second(raw_env, args.steps)
      raw.append(wall)
      raw_cpu.append(cpu)
      wall, cpu = actor_steps_per_second(actor_env, actor, args.steps)
      acting.append(wall)
      acting_cpu.append(cpu)
      print(f"raw {raw[-1]:.0f} steps/s   actor {acting[-1]:.0f} steps/s   "
            f"ratio {acting[-1] / raw[-1]:.2f}   (CPU-time ratio "
            f"{acting_cpu[-1] / raw_cpu[-1]:.2f})", flush=True)
    items = reverb.Client(server.address).server_info()["replay"].current_size
  ratio = statistics.median(acting) / statistics.median(raw)
  cpu_ratio = statistics.median(acting_cpu) / statistics.median(raw_cpu)
  print(f"actor/raw steps/s = {ratio:.2f} (target >= 0.7); CPU-time ratio {cpu_ratio:.2f}; "
        f"{items} items written; weights version {actor.weights_version}")
  write_result("agents_actor_throughput", {
      "task": TASK, "steps_per_round": args.steps, "rounds": args.rounds,
      "raw_env_steps_per_second": raw, "actor_steps_per_second": acting,
      "ratio_of_medians": ratio, "target": 0.7,
      "raw_env_steps_per_cpu_second": raw_cpu, "actor_steps_per_cpu_second": acting_cpu,
      "cpu_time_ratio_of_medians": cpu_ratio, "replay_items_written": int(items),
      "policy_layers": list(config.policy_layers), "n_step": config.n_step,
      "variable_update_period": config.variable_update_period,
      "command": "python benchmarks/agents_actor_throughput.py " + " ".join(sys.argv[1:]),
  })


if __name__ == "__main__":
  main()
