"""`replicator`: launch distributed D4PG, evaluate and plot runs, list tasks, train vision models.

    replicator launch d4pg                       # short distributed run on this machine
    replicator launch d4pg --env walker:walk --actors 8 --steps 2000000 \\
        --learner-replicas cpu:2 --run-dir runs/walker --config.batch_size=256
    replicator evaluate --run-dir runs/walker --episodes 10 --video walker.mp4
    replicator plot --run-dir runs/walker
    replicator list-tasks

Exit status: 0 finished, 130 interrupted (every node saved), 1 a node failed (at run
time, or to stop cleanly or to save: the message names it and its log), 2 a usage
error (one line saying what to do; nothing in an existing run directory is touched).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import os
import socket
import sys
import time
from collections.abc import Sequence

from launch.errors import EXIT_INTERRUPTED, EXIT_NODE_FAILED, LaunchError

_PROG = "replicator"
# Modules that may register `replicator train NAME` (each has `register(subparsers)`).
_TRAIN_MODULES = ("vision.resnet_cli", "vision.sngan_cli")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (usage stays available through --help)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    from launch import d4pg_program  # pylint: disable=import-outside-toplevel
    from launch.launcher import BACKENDS  # pylint: disable=import-outside-toplevel

    defaults = d4pg_program.D4PGProgramSettings()
    # Flags a run remembers (launch.run_settings) default to None = "not given"; their
    # help says the default of a new run.
    own = ", or the run's own when resuming"
    parser = _Parser(prog=_PROG, description=__doc__.split("\n")[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    launch = commands.add_parser("launch", help="run a distributed program", allow_abbrev=False)
    programs = launch.add_subparsers(dest="program", metavar="PROGRAM", parser_class=_Parser)
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
    d4pg.add_argument(
        "--env",
        default=None,
        help=f"dm-control task (default: {defaults.task}, or the run's own when resuming)",
    )
    d4pg.add_argument(
        "--actors",
        type=int,
        default=None,
        help=f"number of actor nodes (default: {defaults.num_actors}{own})",
    )
    d4pg.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help=f"where nodes run: local processes, Ray actors, or threads (default: local{own})",
    )
    d4pg.add_argument(
        "--learner-replicas",
        default=None,
        metavar="SPEC",
        help="replication spec of the learner: cpu, cpu:N, gpu, multiworker, "
        f"tpu, ps (default: {defaults.learner_replicas}{own})",
    )
    d4pg.add_argument(
        "--steps",
        type=int,
        default=None,
        help="actor steps budget of the run, counted over relaunches "
        f"(default: {d4pg_program.QUICK_STEPS}{own})",
    )
    d4pg.add_argument(
        "--run-dir", default=None, help="run directory (default: runs/d4pg-TASK-TIMESTAMP)"
    )
    d4pg.add_argument(
        "--preset",
        choices=sorted(d4pg_program.PRESETS),
        default=None,
        help="base hyperparameters: 'quick' (small networks, learns in minutes "
        "on a laptop) or 'paper' (the published D4PG settings); "
        "default: quick for a new run, the run's own when resuming",
    )
    d4pg.add_argument(
        "--show-config",
        action="store_true",
        help="print the effective config as --config flags and exit",
    )
    d4pg.add_argument(
        "--ray-address",
        default=None,
        metavar="HOST:PORT",
        help="Ray cluster to join (backend ray); default: a private local Ray instance",
    )
    d4pg.add_argument(
        "--bind-host",
        default=None,
        help="address servers are advertised on; 0.0.0.0 advertises each "
        "machine's IP (needed on a multi-machine Ray cluster) "
        f"(default: 127.0.0.1{own})",
    )
    d4pg.add_argument(
        "--replay-port",
        type=int,
        default=None,
        help=f"replay server port (default: 0, any free port{own})",
    )
    d4pg.add_argument(
        "--eval-every",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"seconds between evaluations (default: {defaults.eval_every_s:g}{own})",
    )
    d4pg.add_argument(
        "--eval-episodes",
        type=int,
        default=None,
        help=f"episodes per evaluation (default: {defaults.eval_episodes}{own})",
    )
    d4pg.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="STEPS",
        help="learner checkpoint period in updates; also every "
        f"{defaults.learner_checkpoint_every_s:g}s "
        f"(default: {defaults.learner_checkpoint_every_steps}{own})",
    )
    d4pg.add_argument(
        "--replay-checkpoint-every",
        type=float,
        default=None,
        metavar="SECONDS",
        help="replay checkpoint period: at most this much experience is lost when the "
        f"replay node dies (default: {defaults.replay_checkpoint_every_s:g}{own})",
    )
    d4pg.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        metavar="N",
        help="restart budget of each node: more than N failures within --restart-window "
        f"stop the run (default: {defaults.max_restarts}{own})",
    )
    d4pg.add_argument(
        "--restart-window",
        type=float,
        default=None,
        metavar="MINUTES",
        help=f"window of the restart budget (default: {defaults.restart_window_s / 60:g}{own})",
    )
    d4pg.add_argument(
        "--progress-every",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between progress lines (default: %(default)s)",
    )
    d4pg.set_defaults(func=_launch_d4pg)

    evaluate = commands.add_parser(
        "evaluate", help="evaluate a run's latest checkpoint", allow_abbrev=False
    )
    evaluate.add_argument("--run-dir", required=True)
    evaluate.add_argument("--env", default=None, help="task (default: the run's own)")
    evaluate.add_argument("--episodes", type=int, default=10)
    evaluate.add_argument(
        "--video",
        default=None,
        metavar="OUT.mp4|OUT.gif",
        help="render the first episode into this file",
    )
    evaluate.add_argument("--seed", type=int, default=12345)
    evaluate.set_defaults(func=_evaluate)

    plot = commands.add_parser(
        "plot", help="plot evaluation return vs steps and time", allow_abbrev=False
    )
    plot.add_argument("--run-dir", required=True)
    plot.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/eval_return.png)")
    plot.set_defaults(func=_plot)

    list_tasks = commands.add_parser("list-tasks", help="list the dm-control tasks")
    list_tasks.set_defaults(func=_list_tasks)

    train = commands.add_parser(
        "train", help="train a vision model (resnet50, sngan)", allow_abbrev=False
    )
    models = train.add_subparsers(dest="model", metavar="MODEL", parser_class=_Parser)
    models.required = True
    if argv and argv[0] == "train":  # Import vision code only when it is asked for.
        found = [m for m in _TRAIN_MODULES if importlib.util.find_spec(m) is not None]
        if not found:
            raise LaunchError(
                "`replicator train` needs the vision trainers (vision.resnet_cli, "
                "vision.sngan_cli), which this installation does not have yet."
            )
        for module in found:
            importlib.import_module(module).register(models)
    return parser


def _split_config_flags(extra: list[str]) -> tuple[dict[str, str], list[str]]:
    """Pulls ``--config.KEY=VALUE`` and ``--config.KEY VALUE`` out of unknown arguments."""
    overrides, rest = {}, []
    i = 0
    while i < len(extra):
        arg = extra[i]
        if arg.startswith("--config."):
            key, eq, value = arg[len("--config.") :].partition("=")
            if not eq:
                if i + 1 >= len(extra):
                    raise LaunchError(f"{arg} needs a value: {arg}=VALUE")
                value = extra[i + 1]
                i += 1
            overrides[key] = value
        else:
            rest.append(arg)
        i += 1
    return overrides, rest


def _flag_value(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _default_run_dir(task: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"d4pg-{task.replace(':', '-')}-{stamp}")


def _check_port_free(port: int) -> None:
    """Reverb binds [::]:PORT on every interface; check that nothing holds it."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise LaunchError(
                    f"--replay-port {port} is already in use; pass another port or "
                    "--replay-port 0 to pick a free one."
                ) from None
            if e.errno == errno.EACCES:
                raise LaunchError(
                    f"--replay-port {port} needs privileges; use a port above 1024."
                ) from None
        finally:
            sock.close()
        return


def _resolve_d4pg(raw_args, overrides: dict[str, str]):
    """Validates everything a D4PG launch needs; writes nothing. Returns its pieces.

    Flags not given take the run's stored values (`launch.run_settings`); `raw_args`
    is left as parsed, so the resolution can be repeated under the run dir's lock.
    """
    from agents.d4pg.config import D4PGConfig  # pylint: disable=import-outside-toplevel
    from launch import d4pg_program, run_settings  # pylint: disable=import-outside-toplevel
    from launch.run_dir import RunDir  # pylint: disable=import-outside-toplevel

    args = argparse.Namespace(**vars(raw_args))
    run_dir = RunDir(args.run_dir) if args.run_dir else None
    given = run_settings.resolve(args, run_settings.read(run_dir) if run_dir else None)
    if args.actors < 1:
        raise LaunchError("--actors must be at least 1.")
    if args.steps < 1:
        raise LaunchError("--steps must be at least 1.")
    if args.eval_episodes < 1:
        raise LaunchError("--eval-episodes must be at least 1.")
    if not 0 <= args.replay_port <= 65535:
        raise LaunchError("--replay-port must be between 0 and 65535.")
    if args.replay_checkpoint_every <= 0:
        raise LaunchError("--replay-checkpoint-every must be a positive number of seconds.")
    if args.max_restarts < 0:
        raise LaunchError("--max-restarts must be 0 or more.")
    if args.restart_window <= 0:
        raise LaunchError("--restart-window must be a positive number of minutes.")
    if args.checkpoint_every < 1:
        raise LaunchError("--checkpoint-every must be at least 1.")
    if args.ray_address and args.backend != "ray":
        raise LaunchError("--ray-address only applies to --backend ray.")
    if args.backend == "ray":
        from launch.launcher import advertise_host_for  # pylint: disable=import-outside-toplevel
        from launch.ray_backend import import_ray  # pylint: disable=import-outside-toplevel

        # Fail fast, before the heavier checks, if Ray is missing.
        import_ray(
            loopback=args.ray_address is None and advertise_host_for(args.bind_host) is not None
        )

    saved = run_dir.read_identity() if run_dir else None

    try:
        if saved is not None and saved.get("program") == "d4pg" and args.preset is None:
            base = D4PGConfig.from_dict(saved.get("config", {}))  # Resume: the run's own settings.
        else:
            base = D4PGConfig.from_overrides(d4pg_program.PRESETS[args.preset or "quick"])
        config = D4PGConfig.from_overrides(overrides, base=base)
    except ValueError as e:
        raise LaunchError(f"{e}. Set keys as --config.KEY=VALUE.") from None

    if args.show_config:
        raise LaunchError(
            "\n".join(
                f"--config.{k}={_flag_value(v)}" for k, v in sorted(config.to_dict().items())
            ),
            exit_code=0,
        )
    task = args.env or (saved or {}).get("task") or d4pg_program.D4PGProgramSettings().task
    import environments  # pylint: disable=import-outside-toplevel

    try:
        environments.parse_task_name(task)
    except environments.UnknownTaskError as e:
        raise LaunchError(str(e)) from None

    replicas = d4pg_program.replicas_of(args.learner_replicas)
    try:
        import replication  # pylint: disable=import-outside-toplevel

        replication.parse(args.learner_replicas)
    except ValueError as e:
        raise LaunchError(f"--learner-replicas: {e}") from None
    if replicas and config.batch_size % replicas:
        raise LaunchError(
            f"--config.batch_size={config.batch_size} must be divisible by the "
            f"{replicas} learner replicas of {args.learner_replicas}."
        )

    run_dir = run_dir or RunDir(_default_run_dir(task))
    identity = d4pg_program.identity(task, config.to_dict())
    resuming = run_dir.check_compatible(identity, ignore=d4pg_program.RESUMABLE_CONFIG_KEYS)
    if args.replay_port:
        _check_port_free(args.replay_port)
    settings = d4pg_program.D4PGProgramSettings(
        task=task,
        num_actors=args.actors,
        learner_replicas=args.learner_replicas,
        replay_port=args.replay_port,
        learner_checkpoint_every_steps=args.checkpoint_every,
        replay_checkpoint_every_s=args.replay_checkpoint_every,
        eval_every_s=args.eval_every,
        eval_episodes=args.eval_episodes,
        max_restarts=args.max_restarts,
        restart_window_s=args.restart_window * 60.0,
    )
    return settings, config, identity, run_dir, resuming, args, given


def _launch_d4pg(raw_args) -> int:
    import shutil  # pylint: disable=import-outside-toplevel

    from launch import d4pg_program, launcher, run_settings  # pylint: disable=import-outside-toplevel
    from launch.metrics import Progress  # pylint: disable=import-outside-toplevel

    settings, config, identity, run_dir, resuming, args, given = _resolve_d4pg(
        raw_args, raw_args.config_overrides
    )
    created = not os.path.exists(run_dir.root)
    run_dir.lock()
    # Ours to remove on failure only if nobody else wrote into it before we locked it.
    created = created and set(os.listdir(run_dir.root)) <= {".launch.lock"}
    try:
        try:
            # Again under the lock: another launcher may have written the run meanwhile.
            raw_args.run_dir = run_dir.root
            settings, config, identity, run_dir, resuming, args, given = _resolve_d4pg(
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
                run_dir.unlock()
                shutil.rmtree(run_dir.root, ignore_errors=True)
            raise
        run_dir.write_identity(identity)
        run_settings.write(run_dir, args, given)
        print(
            f"{'Resuming' if resuming else 'Starting'} distributed D4PG on {settings.task}: "
            f"{settings.num_actors} actor(s), learner {settings.learner_replicas}, backend "
            f"{args.backend}, budget {args.steps:,} actor steps"
            + (f" ({int(done):,} done)" if done else "")
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
        outcome = launcher.run(
            program,
            run_dir,
            backend,
            progress_every=args.progress_every,
            stop_when=lambda p: p.totals["actor_steps"] >= args.steps,
        )
    finally:
        run_dir.unlock()
    return _report(outcome, run_dir)


def _report(outcome, run_dir) -> int:
    """Prints how the run ended; returns the exit status (see the module docstring)."""
    p = outcome.progress
    summary = (
        f"{int(p.totals['actor_steps']):,} actor steps, "
        f"{int(p.gauges.get('learner_steps', 0)):,} learner steps"
    )
    if p.last_eval:
        summary += f", last eval return {p.last_eval['return']:.1f}"
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
        f"  evaluate: {_PROG} evaluate --run-dir {run_dir.root} --episodes 10\n"
        f"  plot:     {_PROG} plot --run-dir {run_dir.root}\n"
        f"  resume:   {_PROG} launch d4pg --run-dir {run_dir.root} --steps N"
    )
    return EXIT_INTERRUPTED if outcome.reason == "interrupted" else 0


def _evaluate(args) -> int:
    from launch.evaluate import evaluate  # pylint: disable=import-outside-toplevel

    if args.episodes < 1:
        raise LaunchError("--episodes must be at least 1.")
    if not os.path.isdir(args.run_dir):
        raise LaunchError(f"--run-dir {args.run_dir} does not exist.")
    result = evaluate(
        args.run_dir, task=args.env, episodes=args.episodes, video=args.video, seed=args.seed
    )
    print(
        f"{result['task']}: return over {result['episodes']} episode(s): mean "
        f"{result['mean']:.1f}, std {result['std']:.1f} (learner step "
        f"{result['learner_steps']:,})"
    )
    if args.video:
        print(f"video of episode 1: {os.path.abspath(args.video)}")
    return 0


def _plot(args) -> int:
    from launch.plot import plot  # pylint: disable=import-outside-toplevel

    print(plot(args.run_dir, args.out))
    return 0


def _list_tasks(args) -> int:
    del args
    import environments  # pylint: disable=import-outside-toplevel

    print("\n".join(environments.list_tasks()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `replicator` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        parser = _build_parser(argv)
        args, extra = parser.parse_known_args(argv)
        overrides, rest = _split_config_flags(extra)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if overrides and getattr(args, "program", None) != "d4pg":
            parser.error("--config.KEY=VALUE flags apply to `launch d4pg` only")
        args.config_overrides = overrides
        code = args.func(args)
    except LaunchError as e:
        stream = sys.stdout if e.exit_code == 0 else sys.stderr
        prefix = "" if e.exit_code == 0 else f"{_PROG}: error: "
        print(f"{prefix}{e}", file=stream, flush=True)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
    except SystemExit as e:  # argparse: --help (0) and usage errors (2).
        return e.code if isinstance(e.code, int) else 0
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
