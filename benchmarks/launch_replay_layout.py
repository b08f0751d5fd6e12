"""The README's command with each replay layout, in one run: learner updates/s, time to 800.

Runs `replicator launch d4pg` as the README does (quick preset, local backend, 2 actors,
cartpole:swingup, the default budget) once per seed and layout
(`--config.transitions_per_item=G`; 1 is one transition per item), one launch at a time.
The layouts alternate and their order flips from seed to seed, so that a drift of the
machine's load falls on both. Per run: learner updates per second of wall time (learner
steps at the end / the run's wall time) and once started (without the start-up: see
`launch_alternating`), actor steps per second, wall time and actor steps to the first
evaluation at or above --target; per layout, the medians over seeds (a seed that misses
counts as never reaching) and the ratios to G=1.

    python benchmarks/launch_replay_layout.py [--groups 1,16 --seeds 0,1,2]

Writes benchmarks/results/launch_replay_layout.json.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from agents_common import write_result  # noqa: E402
from launch_alternating import TASK, run_alternating, summarise  # noqa: E402

from launch.d4pg import program as d4pg_program  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", default="1,16", help="transitions per item, 1 first")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--target", type=float, default=800.0)
    parser.add_argument("--max-minutes", type=float, default=20.0, help="per launch")
    args = parser.parse_args()
    groups = [int(g) for g in args.groups.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]

    settings = {str(g): [f"--config.transitions_per_item={g}"] for g in groups}
    runs = run_alternating(settings, seeds, args.target, args.max_minutes)
    summary = summarise(runs)
    base = summary[str(groups[0])]
    for group in groups[1:]:
        s = summary[str(group)]
        s["learner_updates_per_s_over_g1"] = (
            s["median_learner_updates_per_s"] / base["median_learner_updates_per_s"]
        )
        s["running_learner_updates_per_s_over_g1"] = (
            s["median_running_learner_updates_per_s"] / base["median_running_learner_updates_per_s"]
        )
        print(
            f"G={group}: learner updates/s x{s['learner_updates_per_s_over_g1']:.2f} of G=1 "
            f"(once started: x{s['running_learner_updates_per_s_over_g1']:.2f}); "
            f"median time to {args.target:g}: {s['median_seconds_to_target']} s "
            f"(G=1: {base['median_seconds_to_target']} s); {s['seeds_reached']}/{len(seeds)} "
            "seeds reached"
        )
    write_result(
        "launch_replay_layout",
        {
            "task": TASK,
            "target_return": args.target,
            "budget_actor_steps": d4pg_program.QUICK_STEPS,
            "groups": groups,
            "seeds": seeds,
            "summary": summary,
            "runs": runs,
            "targets": {"learner_updates_per_s_over_g1": 2.0, "median_seconds_to_800": 45},
            "noisy": any(r["noisy"] for per in runs.values() for r in per.values()),
            "command": "python benchmarks/launch_replay_layout.py " + " ".join(sys.argv[1:]),
        },
    )


if __name__ == "__main__":
    main()
