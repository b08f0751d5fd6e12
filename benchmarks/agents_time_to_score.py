"""Wall-clock and environment steps for D4PG to reach an evaluation return on cartpole:swingup.

Runs the single-process runner (replay server, learner thread, one actor, evaluator) until
the mean return of `--eval-episodes` noise-free evaluation episodes reaches `--target`
(default 800), or the step / time budget runs out. Target: under 15 minutes.

Hyperparameters: D4PG defaults except the `--config` overrides; the default overrides are
the small, fast setting also used by the learning test (batch 64, 64x64 policy, 128x128
critic, Adam 1e-3); the algorithm itself is unchanged. Pass `--config ''` for the
published defaults (batch 256, 256x3 / 512-512-256 networks, Adam 1e-4), which are much
slower per update on a 2-core CPU.

Published reference (approximate, read from learning curves, not a quoted number): D4PG
on cartpole:swingup approaches its ~850 asymptote within the first ~1e5-1e6 environment
steps in the DeepMind Control Suite report (Tassa et al. 2018, arXiv:1801.00690) and in
Acme's D4PG baselines (Hoffman et al. 2020, arXiv:2006.00979); those runs used many
actors and/or accelerators, so only the step count is comparable, not the wall clock.

Usage: .venv/bin/python benchmarks/agents_time_to_score.py [--target 800 --max-minutes 15]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # The repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent))  # agents_common.

from agents_common import write_result

TASK = "cartpole:swingup"
FAST = "batch_size=64,policy_layers=64:64,critic_layers=128:128,policy_lr=1e-3,critic_lr=1e-3"
PUBLISHED = (
    "D4PG on cartpole:swingup approaches ~850 within ~1e5-1e6 environment steps "
    "(approximate, read from curves in Tassa et al. 2018 arXiv:1801.00690 and "
    "Hoffman et al. 2020 arXiv:2006.00979; distributed runs)."
)


def _parse_overrides(text: str) -> dict:
    """'a=1,b=2:3' -> {'a': '1', 'b': '2,3'} (':' separates tuple items inside a value)."""
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        out[key.strip()] = value.replace(":", ",")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=800.0)
    parser.add_argument("--max-minutes", type=float, default=15.0)
    parser.add_argument("--max-steps", type=int, default=300_000)
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--eval-episodes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default=FAST, help="overrides, e.g. 'batch_size=64,sigma=0.2'")
    args = parser.parse_args()

    import replication

    repl = replication.make("cpu")
    from agents.d4pg.config import D4PGConfig
    from agents.d4pg.local_runner import run_single_process

    config = D4PGConfig.from_overrides({**_parse_overrides(args.config), "seed": args.seed})

    def log(event: dict) -> None:
        if event["label"] == "evaluation":
            print(
                json.dumps(
                    {k: (round(v, 1) if isinstance(v, float) else v) for k, v in event.items()}
                ),
                flush=True,
            )

    start = time.perf_counter()
    results = run_single_process(
        config,
        TASK,
        num_actor_steps=args.max_steps,
        eval_every=args.eval_every,
        eval_episodes=args.eval_episodes,
        target_return=args.target,
        replicator=repl,
        max_seconds=args.max_minutes * 60,
        logger=log,
    )
    wall = time.perf_counter() - start
    if results.reached_target:
        print(
            f"reached {args.target} after {results.steps_to_target} env steps, "
            f"{results.seconds_to_target / 60:.1f} min (target < 15 min)"
        )
    else:
        print(
            f"did not reach {args.target} within {results.actor_steps} steps / "
            f"{wall / 60:.1f} min; evaluations: {results.eval_returns}"
        )
    print(f"published: {PUBLISHED}")
    write_result(
        "agents_time_to_score",
        {
            "task": TASK,
            "target_return": args.target,
            "reached": results.reached_target,
            "env_steps_to_target": results.steps_to_target,
            "minutes_to_target": (
                results.seconds_to_target / 60 if results.seconds_to_target is not None else None
            ),
            "eval_returns": results.eval_returns,
            "learner_steps": results.learner_steps,
            "actor_steps": results.actor_steps,
            "wall_minutes": wall / 60,
            "config_overrides": _parse_overrides(args.config),
            "seed": args.seed,
            "published_reference": PUBLISHED,
            "command": "python benchmarks/agents_time_to_score.py " + " ".join(sys.argv[1:]),
        },
    )


if __name__ == "__main__":
    main()
