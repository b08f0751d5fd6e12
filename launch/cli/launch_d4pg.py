"""`replicator launch d4pg`: runs distributed D4PG, or resumes it from its run directory.

Exit status: 0 finished, 130 interrupted (every node saved), 1 a node failed (at run
time, or to stop cleanly or to save: the message names it and its log), 2 a usage
error (one line saying what to do; nothing in an existing run directory is touched).
"""

from __future__ import annotations

import argparse
import os

from launch.cli import d4pg_flags, quiet, run_settings
from launch.cli.common import PROG, Parser, flag_value
from launch.runtime.errors import EXIT_INTERRUPTED, EXIT_NODE_FAILED, LaunchError

# A relaunch waits this long for nodes of a killed launch still saving in the run dir (a
# node exits at most its stop timeout after its launcher died; the replay's is 60 s).
PREVIOUS_NODES_WAIT_S = 180.0


def register(commands) -> None:
    """Adds `launch` and its program `d4pg` to the `replicator` subcommands."""
    launch = commands.add_parser("launch", help="run a distributed program", allow_abbrev=False)
    programs = launch.add_subparsers(dest="program", metavar="PROGRAM", parser_class=Parser)
    programs.required = True
    d4pg = programs.add_parser(
        "d4pg",
        help="distributed D4PG: replay, learner, actors, evaluator",
        allow_abbrev=False,
        description="Distributed D4PG. Every hyperparameter can be set with "
        "--config.KEY=VALUE (e.g. --config.batch_size=256); "
        "--show-config prints them all. Relaunching with the same --run-dir "
        "resumes the run.",
    )
    d4pg_flags.add_flags(d4pg)
    d4pg.set_defaults(func=run)


def run(raw_args: argparse.Namespace) -> int:
    """Launches (or resumes) the run; returns the exit status (see the module docstring)."""
    import shutil  # pylint: disable=import-outside-toplevel

    from launch.d4pg import program as d4pg_program  # pylint: disable=import-outside-toplevel
    from launch.runtime import launcher  # pylint: disable=import-outside-toplevel
    from launch.runtime.metrics import Progress  # pylint: disable=import-outside-toplevel
    from launch.runtime.run_dir import LOCK_FILES  # pylint: disable=import-outside-toplevel

    settings, config, identity, run_dir, resuming, args, given = d4pg_flags.resolve(
        raw_args, raw_args.config_overrides
    )
    created = not os.path.exists(run_dir.root)
    # The object holding the lock: `run_dir` is resolved again below, as a new object.
    locked = run_dir
    locked.lock(wait_for_nodes_s=PREVIOUS_NODES_WAIT_S, notify=lambda m: print(m, flush=True))
    # Ours to remove on failure only if nobody else wrote into it before we locked it.
    created = created and set(os.listdir(run_dir.root)) <= LOCK_FILES
    try:
        try:
            # Again under the lock: another launcher may have written the run meanwhile.
            raw_args.run_dir = run_dir.root
            settings, config, identity, run_dir, resuming, args, given = d4pg_flags.resolve(
                raw_args, raw_args.config_overrides
            )
            program = d4pg_program.make_program(settings, config.to_dict())
            done = Progress(run_dir, "d4pg").totals["actor_steps"] if resuming else 0
            if done >= args.steps:
                print(
                    f"The run in {run_dir.root} already has {int(done):,} actor steps (budget "
                    f"{args.steps:,}); pass a larger --steps to train further."
                )
                return 0
            backend = launcher.make_backend(
                args.backend,
                run_dir,
                program,
                ray_address=args.ray_address,
                bind_host=args.bind_host,
            )
        except BaseException:
            if created:
                locked.unlock()
                shutil.rmtree(locked.root, ignore_errors=True)
            raise
        run_dir.write_identity(identity)
        quiet.move_to(run_dir.path("logs", "launcher.log"))
        run_settings.write(run_dir, args, given)
        print(
            f"{'Resuming' if resuming else 'Starting'} distributed D4PG on {settings.task}: "
            f"{settings.num_actors} actor(s), learner "
            + (f"{settings.learner_workers} workers x " if settings.learner_workers > 1 else "")
            + f"{settings.learner_replicas}, backend "
            f"{args.backend}, budget {args.steps:,} actor steps"
            + (f" ({int(done):,} done)" if done else "")
        )
        if args.preset_task_values:
            print(
                f"The preset's values for {settings.task}: "
                + ", ".join(
                    f"--config.{k}={flag_value(v)}"
                    for k, v in sorted(args.preset_task_values.items())
                )
                + " (learns it faster per actor step, docs/d4pg.md; override any with "
                "--config.KEY=VALUE)"
            )
        if resuming and given:
            print(
                "Overriding the run's settings: " + ", ".join(f"{k}={v}" for k, v in given.items())
            )
        print(
            f"Run directory: {run_dir.root}  (config: {run_dir.path('config.json')}; "
            f"logs: {run_dir.path('logs')}; TensorBoard: --logdir {run_dir.path('tensorboard')})",
            flush=True,
        )
        note = getattr(backend, "startup_note", "")  # What this backend cannot promise.
        for line in (note, exposure_note(settings)):
            if line:
                print(line, flush=True)
        outcome = launcher.run(
            program,
            run_dir,
            backend,
            progress_every=args.progress_every,
            stop_when=lambda p: p.totals["actor_steps"] >= args.steps,
        )
    finally:
        locked.unlock()
    return report(outcome, run_dir)


def exposure_note(settings) -> str:
    """One line for a learner group, whose servers the platform cannot keep private (issue 18,
    item 12): TensorFlow 2.15's gRPC servers bind every interface and run any graph a peer
    sends, and nothing here can bind them to `--bind-host`."""
    if settings.learner_workers < 2:
        return ""
    return (
        "Note: the learner group's TensorFlow servers listen on all interfaces and run graphs "
        "sent by any peer (TensorFlow 2.15 cannot bind one address): run it on a private "
        "network or behind a firewall (docs/fault-tolerance.md, Security)."
    )


def report(outcome, run_dir) -> int:
    """Prints how the run ended; returns the exit status (see the module docstring)."""
    p = outcome.progress
    summary = (
        f"{int(p.totals['actor_steps']):,} actor steps, "
        f"{int(p.gauges.get('learner_steps', 0)):,} learner steps"
    )
    if p.last_eval:
        # Which evaluation: the last one may be up to an evaluation period before the end.
        episodes = int(p.last_eval.get("episodes", 0))
        summary += (
            f", last eval return {p.last_eval['return']:.1f} @ "
            f"{int(p.last_eval['actor_steps']):,} actor steps"
            + (f" ({episodes} episode{'s' if episodes != 1 else ''})" if episodes else "")
        )
    unsaved = ""
    if outcome.stop_failures:
        unsaved = "\nNot stopped cleanly (its last state may not be saved):\n  " + "\n  ".join(
            outcome.stop_failures
        )
    if outcome.reason == "failed":
        raise LaunchError(
            f"{outcome.message}\nState so far: {summary}.{unsaved}", exit_code=EXIT_NODE_FAILED
        )
    if unsaved:
        raise LaunchError(
            f"the run {outcome.reason}, but a node failed to stop cleanly or to save.{unsaved}\n"
            f"State so far: {summary}. Relaunch with --run-dir {run_dir.root} to resume from "
            "the last checkpoints.",
            exit_code=EXIT_NODE_FAILED,
        )
    verb = {"finished": "Finished", "interrupted": "Stopped"}.get(outcome.reason, "Ended")
    print(
        f"{verb}: {summary}.\n"
        f"  evaluate: {PROG} evaluate {run_dir.root} --episodes 10\n"
        f"  export:   {PROG} export {run_dir.root} --out POLICY_DIR\n"
        f"  plot:     {PROG} plot {run_dir.root}\n"
        f"  resume:   {PROG} launch d4pg --run-dir {run_dir.root} --steps N"
    )
    return EXIT_INTERRUPTED if outcome.reason == "interrupted" else 0
