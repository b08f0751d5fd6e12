"""What a replay checkpoint costs: seconds, bytes on disk, restore time, server stall.

Fills a D4PG replay server (with a Reverb checkpointer) with real rendered cartpole
frames (84x84x3 uint8, n = 5, one item per step, as `agents_replay_memory.py` does),
at two sizes, and for each: times `client.checkpoint()`, measures the checkpoint's
size on disk, times a fresh server's restore from it, and the longest `server_info`
call made from another thread during the checkpoint (how long the server stalls).
Both sizes give a per-step cost; the 1M-transition figures are the linear
extrapolation of the larger size (stated as such in the result).

Usage: python benchmarks/launch_replay_checkpoint.py [--steps 10000 20000 --frames 300]
Writes benchmarks/results/launch_replay_checkpoint.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # The repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent))  # agents_common.

import numpy as np
from agents_common import write_result

TASK = "cartpole:swingup"
TARGET_STEPS = 1_000_000


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10_000, 20_000])
    parser.add_argument("--frames", type=int, default=300, help="distinct rendered frames")
    parser.add_argument("--rounds", type=int, default=3, help="checkpoints timed per size")
    args = parser.parse_args()

    import dm_env
    import reverb

    import environments
    from agents.d4pg import replay
    from agents.d4pg.adders import NStepTransitionAdder
    from agents.d4pg.config import D4PGConfig

    config = D4PGConfig.from_overrides(
        {"from_pixels": True, "samples_per_insert": 0, "min_replay_size": 1}
    )
    env = environments.make(TASK, seed=0, from_pixels=True, height=84, width=84)
    spec = environments.make_environment_spec(env)
    rng = np.random.default_rng(0)
    frames = [env.reset().observation]
    while len(frames) < args.frames:
        timestep = env.step(rng.uniform(-1, 1, env.action_spec().shape).astype(np.float32))
        frames.append(timestep.reset().observation if timestep.last() else timestep.observation)
    action = np.zeros(env.action_spec().shape, np.float32)

    sizes = []
    for steps in args.steps:
        directory = tempfile.mkdtemp(prefix="replay-ckpt-")
        server = replay.make_replay_server(config, spec, checkpoint_dir=directory)
        client = reverb.Client(f"localhost:{server.port}")
        adder = NStepTransitionAdder(client, config.n_step, env.action_spec().shape)
        t = 0
        while t < steps:
            adder.add_first(dm_env.restart(frames[t % len(frames)]))
            for k in range(1000):
                obs = frames[(t + k + 1) % len(frames)]
                last = k == 999
                adder.add(
                    action, dm_env.truncation(0.0, obs) if last else dm_env.transition(0.0, obs)
                )
            t += 1000
        adder.flush()
        items = replay.table_size(client)

        seconds, stalls = [], []
        for _ in range(args.rounds):
            stop, worst = threading.Event(), [0.0]

            def probe(stop=stop, worst=worst, port=server.port):
                probe_client = reverb.Client(f"localhost:{port}")
                while not stop.is_set():
                    t0 = time.perf_counter()
                    probe_client.server_info()
                    worst[0] = max(worst[0], time.perf_counter() - t0)
                    time.sleep(0.005)

            thread = threading.Thread(target=probe, daemon=True)
            thread.start()
            time.sleep(0.05)
            t0 = time.perf_counter()
            client.checkpoint()
            seconds.append(time.perf_counter() - t0)
            stop.set()
            thread.join()
            stalls.append(worst[0])
        disk = _du(directory)  # Reverb keeps only the latest checkpoint.
        server.stop()
        t0 = time.perf_counter()
        restored = replay.make_replay_server(config, spec, checkpoint_dir=directory)
        restore_s = time.perf_counter() - t0
        restored_items = replay.table_size(reverb.Client(f"localhost:{restored.port}"))
        restored.stop()
        shutil.rmtree(directory, ignore_errors=True)
        entry = {
            "steps": steps,
            "items": items,
            "checkpoint_seconds_rounds": seconds,
            "checkpoint_seconds_median": statistics.median(seconds),
            "server_info_longest_call_during_checkpoint_s": stalls,
            "disk_bytes": disk,
            "restore_seconds": restore_s,
            "restored_items": restored_items,
        }
        print(entry, flush=True)
        sizes.append(entry)

    big = sizes[-1]
    scale = TARGET_STEPS / big["steps"]
    load = os.getloadavg()
    write_result(
        "launch_replay_checkpoint",
        {
            "task": TASK,
            "observation_shape": list(frames[0].shape),
            "sizes": sizes,
            "extrapolated_to_1M_steps": {
                "method": f"linear from {big['steps']} steps (x{scale:g}); not measured",
                "checkpoint_seconds": big["checkpoint_seconds_median"] * scale,
                "disk_gib": big["disk_bytes"] * scale / 2**30,
                "restore_seconds": big["restore_seconds"] * scale,
            },
            "noisy": load[0] > 2,
            "command": "python benchmarks/launch_replay_checkpoint.py " + " ".join(sys.argv[1:]),
        },
    )


if __name__ == "__main__":
    main()
