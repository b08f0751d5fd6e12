"""The categorical projection's cost: the dense [B, N', N] form against the scatter form.

`losses.categorical_l2_project` scatters each target atom's mass to the two support atoms
around it. Until 2026-12-06 it weighed every target atom against every support atom (an
[B, N', N] tensor, kept here as `dense_projection`, the baseline). This measures, in one
process, in rotated rounds with medians:

  * the projection alone under XLA (batch 64, 16 projections per compiled call, as the
    fused learner's 16 updates), process CPU microseconds per projection;
  * the whole quick-preset learner (policy 64-64, critic 128-128, batch 64, 16 updates per
    call, XLA) on a fixed in-memory batch, updates/s, with each projection traced into it,
    at 51 atoms (the default) and 101.

Both forms compute the same projection (`tests/agents/test_losses.py` holds the current one
to a loop-by-loop numpy reference); the largest difference between them is printed.

    python benchmarks/agents_projection.py [--rounds 5]

Writes benchmarks/results/agents_projection.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # The repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent))  # agents_common.

from agents_common import fixed_batch_input_fn, rotated, write_result
from agents_learner import _cpu_and_wall

TASK = "cartpole:swingup"
QUICK = {"policy_layers": "64,64", "critic_layers": "128,128", "batch_size": 64}
BATCH = 64
CALLS_PER_COMPILED_LOOP = 16


def dense_projection(target_atoms, target_probs, support):
    """The former projection: every target atom against every support atom, [B, N', N]."""
    import tensorflow as tf

    support = tf.cast(support, tf.float32)
    vmin, vmax = support[0], support[-1]
    delta = support[1] - support[0]
    clipped = tf.clip_by_value(tf.cast(target_atoms, tf.float32), vmin, vmax)
    distance = tf.abs(clipped[:, :, None] - support[None, None, :])
    weights = tf.maximum(0.0, 1.0 - distance / delta)
    return tf.reduce_sum(weights * tf.cast(target_probs, tf.float32)[:, :, None], axis=1)


def _projection_loop(project, num_atoms: int):
    """A compiled call of 16 projections of [64, num_atoms] targets, and its inputs."""
    import tensorflow as tf

    support = tf.linspace(-10.0, 110.0, num_atoms)
    rng = tf.random.Generator.from_seed(num_atoms)
    returns = rng.uniform([BATCH], 0.0, 5.0)
    atoms = returns[:, None] + 0.95 * support[None, :]
    probs = tf.nn.softmax(rng.normal([BATCH, num_atoms]))

    @tf.function(jit_compile=True)
    def loop(atoms, probs):
        total = tf.zeros([BATCH, num_atoms])
        for i in range(CALLS_PER_COMPILED_LOOP):
            total += project(atoms + 0.01 * i, probs, support)
        return total

    return (lambda: loop(atoms, probs).numpy()), (atoms, probs, support)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement (about)")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("need --rounds >= 2 (to report a spread)")

    import tensorflow as tf

    import environments
    import replication
    from agents.d4pg import losses
    from agents.d4pg.config import D4PGConfig
    from agents.d4pg.learning import D4PGLearner

    forms = {"dense": dense_projection, "scatter": losses.categorical_l2_project}
    atom_counts = (51, 101)
    loads = [os.getloadavg()[0]]

    loops, max_difference = {}, {}
    for n in atom_counts:
        for form, project in forms.items():
            loops[(form, n)], inputs = _projection_loop(project, n)
        difference = forms["dense"](*inputs) - forms["scatter"](*inputs)
        max_difference[n] = float(tf.reduce_max(tf.abs(difference)))

    repl = replication.make("cpu")
    env = environments.make(TASK, seed=0)
    spec = environments.make_environment_spec(env)
    obs_dim, act_dim = spec.observations.shape[0], spec.actions.shape[0]
    learners = {}
    original = losses.categorical_l2_project
    for n in atom_counts:
        config = D4PGConfig.from_overrides(
            {**QUICK, "num_atoms": n, "updates_per_call": CALLS_PER_COMPILED_LOOP}
        )
        for form, project in forms.items():
            # The learner traces its call on the first step: the form in place then is the
            # one compiled into it for good.
            losses.categorical_l2_project = project
            try:
                learner = D4PGLearner(
                    config, spec, repl, fixed_batch_input_fn(config, obs_dim, act_dim, seed=0)
                )
                learner.step()
            finally:
                losses.categorical_l2_project = original
            learners[(form, n)] = learner

    probe_projection = _cpu_and_wall(loops[("dense", 51)], 3)[1]
    probe_learner = _cpu_and_wall(learners[("dense", 51)].step, 3)[0]
    projection_us = {key: [] for key in loops}
    updates_per_s = {key: [] for key in learners}
    keys = list(loops)
    for r in range(args.rounds):
        for key in rotated(keys, r):
            calls = max(3, int(args.seconds / probe_projection))
            per_call = _cpu_and_wall(loops[key], calls)[1]
            projection_us[key].append(per_call / CALLS_PER_COMPILED_LOOP * 1e6)
            calls = max(3, int(args.seconds / probe_learner))
            per_call = _cpu_and_wall(learners[key].step, calls)[0]
            updates_per_s[key].append(CALLS_PER_COMPILED_LOOP / per_call)
        loads.append(os.getloadavg()[0])
        print(
            f"round {r}: "
            + ", ".join(
                f"{form} N={n} {projection_us[(form, n)][-1]:.0f} us, "
                f"{updates_per_s[(form, n)][-1]:.0f} updates/s"
                for form, n in keys
            ),
            flush=True,
        )

    def name(key):
        return f"{key[0]}_{key[1]}_atoms"

    projection_median = {name(k): statistics.median(v) for k, v in projection_us.items()}
    updates_median = {name(k): statistics.median(v) for k, v in updates_per_s.items()}
    ratios = {}
    for n in atom_counts:
        per_round = [
            s / d
            for s, d in zip(updates_per_s[("scatter", n)], updates_per_s[("dense", n)], strict=True)
        ]
        ratios[f"learner_scatter_over_dense_{n}_atoms"] = {
            "median": statistics.median(per_round),
            "min": min(per_round),
            "max": max(per_round),
            "rounds": per_round,
        }
        ratios[f"projection_dense_over_scatter_cpu_{n}_atoms"] = (
            projection_median[name(("dense", n))] / projection_median[name(("scatter", n))]
        )
    max_load = max(loads)
    result = {
        "benchmark": "agents_projection",
        "command": "python benchmarks/agents_projection.py " + " ".join(sys.argv[1:]),
        "batch_size": BATCH,
        "updates_per_call": CALLS_PER_COMPILED_LOOP,
        "projection_cpu_us_median": projection_median,
        "projection_cpu_us_rounds": {name(k): v for k, v in projection_us.items()},
        "learner_updates_per_s_median": updates_median,
        "learner_updates_per_s_rounds": {name(k): v for k, v in updates_per_s.items()},
        "ratios": ratios,
        "max_abs_difference_dense_vs_scatter": {f"{n}_atoms": d for n, d in max_difference.items()},
        "rounds": args.rounds,
        "order": "rotated by one configuration every round",
        "load_average": {"max": max_load, "samples": loads},
        "noisy": max_load > 2.0,
    }
    write_result("agents_projection", result)
    for n in atom_counts:
        print(
            f"{n} atoms: projection {projection_median[name(('dense', n))]:.0f} -> "
            f"{projection_median[name(('scatter', n))]:.0f} us CPU; learner "
            f"{updates_median[name(('dense', n))]:.0f} -> "
            f"{updates_median[name(('scatter', n))]:.0f} updates/s "
            f"(x{ratios[f'learner_scatter_over_dense_{n}_atoms']['median']:.2f}); "
            f"max difference {max_difference[n]:.1e}"
        )


if __name__ == "__main__":
    main()
