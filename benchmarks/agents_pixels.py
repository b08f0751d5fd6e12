"""D4PG from pixels on a 2-core CPU: where the time goes, and what a budget here reaches.

Two parts:
  profile: per agent step, physics vs rendering (the same env from features and from
    pixels), the actor's numpy conv torso + policy, and one learner update (random-shift
    augmentation included) on a fixed batch: best of a few rounds each.
  learn:   `python -m launch.cli launch d4pg` from pixels (local backend, 2 actors,
    augmentation on) on cartpole:swingup and ball_in_cup:catch with settings made for
    this machine (PIXEL_OVERRIDES: 64x64 frames, a two-layer stride-2 torso, learning
    from 500 stored steps; the per-domain action repeat: cartpole 8, ball_in_cup 4), a
    fixed agent-step budget per task.

    python benchmarks/agents_pixels.py --profile-only
    python benchmarks/agents_pixels.py --tasks cartpole:swingup --budget-scale 0.05

Writes benchmarks/results/agents_pixels.json (merging learning runs by task and seed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

RESULTS = os.path.join(ROOT, "benchmarks", "results", "agents_pixels.json")

# On top of the launch command's default (quick) preset. 84x84 frames with the
# (32, 32, 32) torso cost ~18 GFLOP per batch-64 update here; 64x64 frames with two
# stride-2 layers of 16 channels cost ~20x less. Rendering costs about the same at any of
# these sizes (see the profile).
PIXEL_OVERRIDES = {
    "from_pixels": "true",
    "image_size": "64",
    "conv_channels": "16,16",
    "conv_kernels": "3,3",
    "conv_strides": "2,2",
    "torso_output_size": "50",
    # The recorded pixel runs used these; the quick preset's later Adam 1e-3 with 32
    # samples per insert was chosen on features and is untried from pixels.
    "samples_per_insert": "16",
    "policy_lr": "3e-4",
    "critic_lr": "3e-4",
    "min_replay_size": "500",
    "variable_update_period": "100",
}
BUDGETS = {"cartpole:swingup": 60_000, "ball_in_cup:catch": 60_000}  # Agent steps.


def _config(task: str):
    from agents.d4pg.config import D4PGConfig
    from launch.d4pg import program as d4pg_program

    base = D4PGConfig.from_overrides(d4pg_program.PRESETS["quick"])
    return D4PGConfig.from_overrides(PIXEL_OVERRIDES, base=base)


def _best_time(fn, rounds: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def profile(task: str, rounds: int = 3) -> dict:
    """Seconds per agent step of each part, at PIXEL_OVERRIDES."""
    import dataclasses

    import numpy as np
    import tensorflow as tf

    import environments
    import replication
    from agents.d4pg import builder, networks
    from agents.d4pg.learning import D4PGLearner, Transition
    from agents.d4pg.numpy_policy import NumpyPolicy

    repl = replication.make("cpu")  # Before any TensorFlow op of this process.
    config = _config(task)
    pixels_env = builder.make_environment(config, task, seed=0)
    features_env = builder.make_environment(
        dataclasses.replace(config, from_pixels=False, frame_stack=None), task, seed=0
    )
    spec = environments.make_environment_spec(pixels_env)
    action = np.zeros(spec.actions.shape, np.float32)

    def stepper(env):
        state = {"t": env.reset()}

        def step():
            if state["t"].last():
                state["t"] = env.reset()
            state["t"] = env.step(action)

        return step

    physics = _best_time(stepper(features_env), rounds, 100)
    with_render = _best_time(stepper(pixels_env), rounds, 100)

    from environments.wrappers import make_camera

    def plain_camera(size: int):
        """The wrapper's camera: kept, no shadow or reflection pass."""
        camera = make_camera(pixels_env.physics, size, size, 0, shadows_and_reflections=False)
        return camera.render

    render_by_size = {
        "physics.render (new camera per call, shadows and reflections)": {
            size: _best_time(
                lambda size=size: pixels_env.physics.render(height=size, width=size, camera_id=0),
                rounds,
                20,
            )
            for size in (48, 64, 84)
        },
        "kept camera, no shadows or reflections (the default)": {
            size: _best_time(plain_camera(size), rounds, 20) for size in (48, 64, 84)
        },
    }

    nets = networks.make_networks(config, spec)
    policy = NumpyPolicy(config, pixels=True, action_low=-1.0, action_high=1.0)
    policy.set_weights([v.numpy() for v in nets.acting_variables()])
    observation = pixels_env.reset().observation
    act = _best_time(lambda: policy(observation), rounds, 50)

    batch = config.batch_size
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (2, batch) + spec.observations.shape).astype(np.uint8)
    data = Transition(
        frames[0],
        rng.uniform(-1, 1, (batch,) + spec.actions.shape).astype(np.float32),
        rng.uniform(0, 8, batch).astype(np.float32),
        np.full(batch, 0.95, np.float32),
        frames[1],
    )
    learner = D4PGLearner(
        config,
        spec,
        repl,
        lambda ctx: tf.data.Dataset.from_tensors(data).repeat(),
    )
    learner.step()  # Trace and compile.
    # One `step()` runs `updates_per_call` updates: report the time of one update.
    update = _best_time(learner.step, rounds, 5) / config.updates_per_call
    return {
        "task": task,
        "agent_step_s": {
            "physics": physics,
            "rendering": max(with_render - physics, 0.0),
            "actor_torso_and_policy": act,
        },
        "render_one_frame_s_by_size": render_by_size,
        "learner_update_s": update,
        "updates_per_agent_step": 1.0 / (config.batch_size / config.samples_per_insert),
        "learner_s_per_agent_step": update * config.samples_per_insert / config.batch_size,
        "image_size": config.image_size,
        "frame_stack": config.resolved_frame_stack(),
        "action_repeat": config.resolved_action_repeat(task),
        "batch_size": config.batch_size,
        "rounds": rounds,
    }


def learn(task: str, seed: int, steps: int, timeout_s: float) -> dict:
    from benchmarks import agents_learning_suite as suite

    overrides = [f"--config.{k}={v}" for k, v in PIXEL_OVERRIDES.items()]
    return suite.run_one(task, seed, steps, timeout_s, keep=False, extra_flags=overrides)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(BUDGETS))
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--budget-scale", type=float, default=1.0)
    parser.add_argument("--timeout-minutes", type=float, default=120.0)
    parser.add_argument("--profile-only", action="store_true")
    parser.add_argument("--results", default=RESULTS)
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in BUDGETS]
    if unknown:
        parser.error(f"unknown task(s) {unknown}; this benchmark has {sorted(BUDGETS)}")

    stored = {}
    if os.path.exists(args.results):
        with open(args.results, encoding="utf-8") as f:
            stored = json.load(f)
    load = os.getloadavg()
    stored["profile"] = {
        "results": [profile(task) for task in tasks],
        "load_average": [round(x, 2) for x in load],
        "noisy": max(load[0], os.getloadavg()[0]) > 2.0,
        "command": "python benchmarks/agents_pixels.py " + " ".join(argv or sys.argv[1:]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    for entry in stored["profile"]["results"]:
        print(json.dumps(entry))
    if not args.profile_only:
        runs = stored.setdefault("runs", {})
        for task in tasks:
            steps = max(1000, int(BUDGETS[task] * args.budget_scale))
            for seed in (int(s) for s in args.seeds.split(",") if s):
                print(f"{task} seed {seed}: {steps:,} agent steps from pixels ...", flush=True)
                result = learn(task, seed, steps, args.timeout_minutes * 60)
                result["budget_scale"] = args.budget_scale
                runs.setdefault(task, {})[str(seed)] = result
                print(
                    f"  final {result['final_eval_return']}, best {result['best_eval_return']}, "
                    f"{result['wall_s']:.0f}s",
                    flush=True,
                )
    stored["overrides"] = PIXEL_OVERRIDES
    stored["budgets_agent_steps"] = BUDGETS
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    with open(args.results, "w", encoding="utf-8") as f:
        json.dump(stored, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"results: {args.results}")


if __name__ == "__main__":
    main()
