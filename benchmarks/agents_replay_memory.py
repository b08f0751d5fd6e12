"""Replay memory per stored pixel step, over the size of one uint8 observation (target <= 1).

A D4PG replay server runs in its own process; the n-step adder writes real rendered
cartpole frames (84x84x3 uint8, n = 5, one item per step) and the server's resident
memory growth is divided by the number of steps stored. Frames are rendered once along a
random-action trajectory and replayed in order (rendering is slow here), so consecutive
steps look like consecutive steps of a real episode.

Each step's observation is written once and referenced by up to n + 1 items; Reverb
stores chunks compressed, so the ratio can be below 1.

Usage: .venv/bin/python benchmarks/agents_replay_memory.py [--steps 20000 --frames 300]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # The repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent))  # agents_common.

import numpy as np
from agents_common import ReplayServerProcess, write_result

TASK = "cartpole:swingup"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--frames", type=int, default=300, help="distinct rendered frames")
    parser.add_argument("--image-size", type=int, default=84)
    args = parser.parse_args()

    import dm_env
    import reverb

    import environments
    from agents.d4pg.adders import NStepTransitionAdder
    from agents.d4pg.config import D4PGConfig

    config = D4PGConfig.from_overrides(
        {
            "from_pixels": True,
            "frame_stack": 1,  # The frames below are single renders.
            "image_size": args.image_size,
            "samples_per_insert": 0,
            "min_replay_size": 1,
            "max_replay_size": args.steps * 2,
        }
    )
    env = environments.make(
        TASK, seed=0, from_pixels=True, height=args.image_size, width=args.image_size
    )
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    frames = [env.reset().observation]
    while len(frames) < args.frames:
        timestep = env.step(rng.uniform(-1, 1, env.action_spec().shape).astype(np.float32))
        frames.append(timestep.reset().observation if timestep.last() else timestep.observation)
    print(
        f"rendered {len(frames)} frames {frames[0].shape} in {time.perf_counter() - start:.0f}s",
        flush=True,
    )
    observation_bytes = frames[0].nbytes
    episode_length = 1000

    with ReplayServerProcess(config, TASK) as server:
        client = reverb.Client(server.address)
        adder = NStepTransitionAdder(client, config.n_step, env.action_spec().shape)
        action = np.zeros(env.action_spec().shape, np.float32)

        def write(num_steps: int, offset: int) -> int:
            """Writes `num_steps` environment steps in episodes; returns steps appended."""
            appended = 0
            t = 0
            while t < num_steps:
                length = min(episode_length, num_steps - t)
                adder.add_first(dm_env.restart(frames[(offset + t) % len(frames)]))
                for k in range(length):
                    obs = frames[(offset + t + k + 1) % len(frames)]
                    last = k == length - 1
                    adder.add(
                        action, dm_env.truncation(0.0, obs) if last else dm_env.transition(0.0, obs)
                    )
                appended += length + 1  # The final observation is a step of its own.
                t += length
            adder.flush()
            return appended

        write(2 * episode_length, 0)  # Warm-up: allocator pools, gRPC buffers.
        time.sleep(1.0)
        before = server.rss_bytes()
        start = time.perf_counter()
        stored = write(args.steps, 2 * episode_length)
        seconds = time.perf_counter() - start
        time.sleep(1.0)
        after = server.rss_bytes()
        items = client.server_info()["replay"].current_size

    per_step = (after - before) / stored
    ratio = per_step / observation_bytes
    print(
        f"{stored} steps ({items} items in total) grew the server by "
        f"{(after - before) / 2**20:.1f} MiB: {per_step:.0f} bytes/step, observation "
        f"{observation_bytes} bytes, ratio {ratio:.3f} (target <= 1.0); "
        f"{stored / seconds:.0f} steps/s written"
    )
    write_result(
        "agents_replay_memory",
        {
            "task": TASK,
            "observation_shape": list(frames[0].shape),
            "observation_bytes": observation_bytes,
            "n_step": config.n_step,
            "steps_stored": stored,
            "items_in_table": int(items),
            "server_rss_growth_bytes": after - before,
            "bytes_per_step": per_step,
            "ratio_to_observation": ratio,
            "target": 1.0,
            "distinct_frames": len(frames),
            "write_steps_per_second": stored / seconds,
            "command": "python benchmarks/agents_replay_memory.py " + " ".join(sys.argv[1:]),
        },
    )


if __name__ == "__main__":
    main()
