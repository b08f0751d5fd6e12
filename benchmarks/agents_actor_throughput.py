"""Actor steps/s over raw env.step steps/s on cartpole:swingup features (target >= 0.7).

The actor does everything a distributed D4PG actor does: numpy policy (default 256x3
layers), Gaussian noise, the n-step adder into a real Reverb server running in another
process, and weight pulls from its "params" table every `variable_update_period` steps.
Raw env steps and actor steps alternate one by one in the same run (two environments of
the same task), so machine load affects both alike; the ratio of the medians of the
per-round wall-clock steps/s is the result. The ratio of this thread's CPU time per step
(time.thread_time) is reported too: it ignores other processes competing for the cores,
but not the cache pollution they cause.

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

import numpy as np
from agents_common import ReplayServerProcess, write_result

TASK = "cartpole:swingup"


def interleaved_rates(raw_env, actor_env, actor, steps: int) -> dict[str, float]:
    """Alternates one raw env.step and one full actor step, `steps` times each.

    Interleaving step by step puts both under the same machine load (other processes'
    bursts last milliseconds), which block-wise alternation does not. Returns wall-clock
    and this thread's CPU-time steps/s of each.
    """
    zero = np.zeros(raw_env.action_spec().shape, np.float32)
    raw_ts = raw_env.reset()
    actor_ts = actor_env.reset()
    actor.observe_first(actor_ts)
    clock, cpu = time.perf_counter, time.thread_time
    raw_wall = raw_cpu = actor_wall = actor_cpu = 0.0
    for _ in range(steps):
        w0, c0 = clock(), cpu()
        if raw_ts.last():
            raw_ts = raw_env.reset()
        raw_ts = raw_env.step(zero)
        w1, c1 = clock(), cpu()
        if actor_ts.last():
            actor_ts = actor_env.reset()
            actor.observe_first(actor_ts)
        action = actor.select_action(actor_ts.observation)
        actor_ts = actor_env.step(action)
        actor.observe(action, actor_ts)
        actor.update()
        w2, c2 = clock(), cpu()
        raw_wall += w1 - w0
        raw_cpu += c1 - c0
        actor_wall += w2 - w1
        actor_cpu += c2 - c1
    return {
        "raw": steps / raw_wall,
        "actor": steps / actor_wall,
        "raw_cpu": steps / raw_cpu,
        "actor_cpu": steps / actor_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps per block")
    parser.add_argument("--rounds", type=int, default=10, help="raw/actor block pairs")
    args = parser.parse_args()

    import reverb

    import environments
    from agents.d4pg import builder, networks, variables
    from agents.d4pg.config import D4PGConfig

    config = D4PGConfig.from_overrides({"samples_per_insert": 0, "min_replay_size": 1})
    env = environments.make(TASK, seed=0)
    spec = environments.make_environment_spec(env)
    with ReplayServerProcess(config, TASK) as server:
        nets = networks.make_networks(config, spec)  # Published once, like a learner would.
        variables.publish(
            reverb.Client(server.address), 0, [v.numpy() for v in nets.acting_variables()]
        )
        actor = builder.make_actor(config, spec, server.address, seed=1)
        actor_env = environments.make(TASK, seed=1)
        raw_env = environments.make(TASK, seed=2)
        interleaved_rates(raw_env, actor_env, actor, 500)  # Warm-up (first pull, writer setup).
        raw, acting, raw_cpu, acting_cpu = [], [], [], []
        for _ in range(args.rounds):
            rates = interleaved_rates(raw_env, actor_env, actor, args.steps)
            raw.append(rates["raw"])
            acting.append(rates["actor"])
            raw_cpu.append(rates["raw_cpu"])
            acting_cpu.append(rates["actor_cpu"])
            print(
                f"raw {raw[-1]:.0f} steps/s   actor {acting[-1]:.0f} steps/s   "
                f"ratio {acting[-1] / raw[-1]:.2f}   (CPU-time ratio "
                f"{acting_cpu[-1] / raw_cpu[-1]:.2f})",
                flush=True,
            )
        items = reverb.Client(server.address).server_info()["replay"].current_size
    ratio = statistics.median(acting) / statistics.median(raw)
    cpu_ratio = statistics.median(acting_cpu) / statistics.median(raw_cpu)
    print(
        f"actor/raw steps/s = {ratio:.2f} (target >= 0.7); CPU-time ratio {cpu_ratio:.2f}; "
        f"{items} items written; weights version {actor.weights_version}"
    )
    write_result(
        "agents_actor_throughput",
        {
            "task": TASK,
            "steps_per_round": args.steps,
            "rounds": args.rounds,
            "raw_env_steps_per_second": raw,
            "actor_steps_per_second": acting,
            "ratio_of_medians": ratio,
            "target": 0.7,
            "raw_env_steps_per_cpu_second": raw_cpu,
            "actor_steps_per_cpu_second": acting_cpu,
            "cpu_time_ratio_of_medians": cpu_ratio,
            "replay_items_written": int(items),
            "policy_layers": list(config.policy_layers),
            "n_step": config.n_step,
            "variable_update_period": config.variable_update_period,
            "command": "python benchmarks/agents_actor_throughput.py " + " ".join(sys.argv[1:]),
        },
    )


if __name__ == "__main__":
    main()
