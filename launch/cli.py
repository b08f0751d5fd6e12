"""`replicator`: launch distributed D4PG, evaluate and plot runs, list tasks, train vision models.

    replicator launch d4pg                       # short distributed run on this machine
    replicator launch d4pg --env walker:walk --actors 8 --steps 2000000 \\
        --learner-replicas cpu:2 --run-dir runs/walker --config.batch_size=256
    replicator evaluate --run-dir runs/walker --episodes 10 --video walker.mp4
    replicator evaluate --run-dir runs/walker --all-snapshots --seeds 1 2 3
    replicator export --run-dir runs/walker --out walker_policy
    replicator plot runs/walker-seed* --metric eval_return
    replicator list-tasks

TensorFlow's, XLA's and Reverb's C++ log lines go to log files, not the console;
`replicator --verbose COMMAND` shows them.

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

from launch.runtime.errors import EXIT_INTERRUPTED, EXIT_NODE_FAILED, LaunchError

_PROG = "replicator"
# A relaunch waits this long for nodes of a killed launch still saving in the run dir (a
# node exits at most its stop timeout after its launcher died; the replay's is 60 s).
_PREVIOUS_NODES_WAIT_S = 180.0
# Modules that may register `replicator train NAME` (each has `register(subparsers)`).
_TRAIN_MODULES = ("vision.resnet.cli", "vision.sngan.cli")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (usage stays available through --help)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    from launch.d4pg import program as d4pg_program  # pylint: disable=import-outside-toplevel
    from launch.runtime.launcher import BACKENDS  # pylint: disable=import-outside-toplevel

    defaults = d4pg_program.D4PGProgramSettings()
    # Flags a run remembers (launch.run_settings) default to None = "not given"; their
    # help says the default of a new run.
    own = ", or the run's own when resuming"
    parser = _Parser(prog=_PROG, description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's, XLA's and Reverb's C++ log lines on the console",
    )
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
        "--envs-per-actor",
        type=int,
        default=None,
        help="environments each actor steps with one batched policy call "
        f"(default: {defaults.envs_per_actor}{own})",
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
        help="replication spec of each learner worker: cpu, cpu:N, cpu:NxM (one worker "
        "only), gpu (all GPUs the worker is given), gpu:N (default: "
        f"{defaults.learner_replicas}{own})",
    )
    d4pg.add_argument(
        "--learner-workers",
        type=int,
        default=None,
        metavar="K",
        help="learner processes forming one synchronous multi-worker learner (each with "
        "--learner-replicas cpu or gpu[:N]; worker 0 publishes and checkpoints) "
        f"(default: {defaults.learner_workers}{own})",
    )
    d4pg.add_argument(
        "--ray-resources",
        action="append",
        default=None,
        metavar="ROLE=NAME:AMOUNT[,...]",
        help="Ray custom resources a role's nodes ask for (backend ray; ROLE: replay, "
        "learner, actor, evaluator), e.g. learner=learner_host:1; repeatable",
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
        help="Ray cluster to join (backend ray; default: $RAY_ADDRESS if set, else a "
        "private local Ray instance)",
    )
    d4pg.add_argument(
        "--bind-host",
        default=None,
        help="address servers are advertised on; 0.0.0.0 advertises each server on "
        "the IP of the machine (Ray node) it runs on, as a multi-machine Ray cluster "
        "needs; with ray, a node's IP places the replay and learner there "
        f"(default: 127.0.0.1{own})",
    )
    d4pg.add_argument(
        "--replay-port",
        type=int,
        default=None,
        help=f"replay server port (default: 0, any free port{own})",
    )
    d4pg.add_argument(
        "--eval-every-steps",
        type=int,
        default=None,
        metavar="N",
        help="actor steps between evaluations (default: 1/20 of --steps, at least 1000)",
    )
    d4pg.add_argument(
        "--eval-every",
        type=float,
        default=None,
        metavar="SECONDS",
        help="schedule evaluations by wall-clock seconds instead of actor steps",
    )
    d4pg.add_argument(
        "--keep-snapshots",
        type=int,
        default=None,
        metavar="N",
        help="policy snapshots (RUN/snapshots/step_N, written with each learner checkpoint) "
        f"to keep (default: {defaults.keep_snapshots}{own})",
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
        "evaluate",
        help="evaluate a policy snapshot (no learner, no replay server)",
        allow_abbrev=False,
        description="Evaluates a policy snapshot without exploration noise: the latest of a "
        "run, --step N of a run, or --snapshot DIR.",
    )
    evaluate.add_argument("--run-dir", default=None, help="a D4PG run directory")
    evaluate.add_argument(
        "--step", type=int, default=None, help="learner step of a kept snapshot (default: latest)"
    )
    evaluate.add_argument(
        "--snapshot", default=None, metavar="DIR", help="a snapshot directory (replicator export)"
    )
    evaluate.add_argument(
        "--all-snapshots",
        action="store_true",
        help="evaluate every kept snapshot of --run-dir and write a CSV (see --out)",
    )
    evaluate.add_argument(
        "--out",
        default=None,
        metavar="CSV",
        help="CSV of --all-snapshots (default: RUN_DIR/snapshot_returns.csv)",
    )
    evaluate.add_argument(
        "--env", default=None, help="task (default: the snapshot's own; same specs needed)"
    )
    evaluate.add_argument(
        "--episodes", type=int, default=10, help="episodes per seed (default: %(default)s)"
    )
    evaluate.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        metavar="SEED",
        help="environment seeds, --episodes each (default: 12345)",
    )
    evaluate.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)
    evaluate.add_argument(
        "--video",
        default=None,
        metavar="OUT.mp4|OUT.gif",
        help="render the first episode into this file, its return written on the frames",
    )
    evaluate.add_argument(
        "--json", action="store_true", help="print one machine-readable JSON line"
    )
    evaluate.set_defaults(func=_evaluate)

    export = commands.add_parser(
        "export",
        help="write a policy snapshot (TF SavedModel) of a run",
        allow_abbrev=False,
        description="Writes a self-contained TF SavedModel of a run's policy: "
        "tf.saved_model.load(OUT).act(observations) -> actions.",
    )
    export.add_argument("--run-dir", required=True)
    export.add_argument(
        "--step", type=int, default=None, help="learner step of a kept checkpoint (default: latest)"
    )
    export.add_argument("--out", required=True, metavar="DIR", help="a new directory")
    export.set_defaults(func=_export)

    from launch.reporting import references  # pylint: disable=import-outside-toplevel

    plot = commands.add_parser(
        "plot",
        help="plot runs (mean and 95%% band over seeds) vs actor steps and wall time",
        allow_abbrev=False,
        description="Plots runs grouped by task and config (runs differing only by seed are "
        "averaged, with a 95% confidence band), against actor steps and wall time.",
    )
    plot.add_argument("runs", nargs="*", metavar="RUN", help="run directories")
    plot.add_argument("--run-dir", default=None, help="one run (same as a single RUN)")
    plot.add_argument(
        "--metric",
        default="eval_return",
        help="a metrics.csv column, e.g. critic_loss (default: %(default)s)",
    )
    plot.add_argument(
        "--group-by",
        default=None,
        metavar="FIELDS",
        help="group runs by these fields instead of task and config: task, config, "
        "config.KEY (comma-separated); needed to plot several tasks together",
    )
    plot.add_argument(
        "--out", default=None, help="PNG path (default: RUN_DIR/METRIC.png, or ./METRIC.png)"
    )
    plot.add_argument(
        "--reference",
        default=None,
        metavar="METHOD[,METHOD...]|all",
        help="also draw these agents' published eval_return curves on the task, from state "
        "features, dashed on the actor-steps panel: "
        f"{', '.join(references.METHOD_NAMES)} or all (source: launch/reporting/data/"
        "dmc_proprio_baselines.json)",
    )
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
                "`replicator train` needs the vision trainers (vision.resnet.cli, "
                "vision.sngan.cli), which this installation does not have yet."
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
    """Reverb binds [::]:PORT on every interface; check that nothing listens there.

    With SO_REUSEADDR, as gRPC binds: connections of a stopped replay that linger in
    TIME_WAIT (a relaunch right after a clean stop) do not keep the port.
    """
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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
    from agents.d4pg.config import (  # pylint: disable=import-outside-toplevel
        SAVED_CONFIG_FALLBACKS,
        D4PGConfig,
    )
    from launch import run_settings  # pylint: disable=import-outside-toplevel
    from launch.d4pg import program as d4pg_program  # pylint: disable=import-outside-toplevel
    from launch.runtime.run_dir import RunDir  # pylint: disable=import-outside-toplevel

    args = argparse.Namespace(**vars(raw_args))
    run_dir = RunDir(args.run_dir) if args.run_dir else None
    given = run_settings.resolve(args, run_settings.read(run_dir) if run_dir else None)
    if "eval_every" in given and "eval_every_steps" in given:
        raise LaunchError("pass --eval-every-steps N or --eval-every SECONDS, not both.")
    # One evaluation schedule: the one given now replaces the run's stored other one.
    if "eval_every" in given:
        args.eval_every_steps = None
    elif "eval_every_steps" in given:
        args.eval_every = None
    if args.actors < 1:
        raise LaunchError("--actors must be at least 1.")
    if args.envs_per_actor < 1:
        raise LaunchError("--envs-per-actor must be at least 1.")
    if args.steps < 1:
        raise LaunchError("--steps must be at least 1.")
    if args.eval_episodes < 1:
        raise LaunchError("--eval-episodes must be at least 1.")
    if args.eval_every_steps is not None and args.eval_every_steps < 1:
        raise LaunchError("--eval-every-steps must be at least 1.")
    if args.eval_every is not None and args.eval_every <= 0:
        raise LaunchError("--eval-every must be a positive number of seconds.")
    if args.keep_snapshots < 1:
        raise LaunchError("--keep-snapshots must be at least 1.")
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
    if args.ray_resources and args.backend != "ray":
        raise LaunchError("--ray-resources only applies to --backend ray.")
    if args.learner_workers < 1:
        raise LaunchError("--learner-workers must be at least 1.")
    if args.backend == "ray":
        from launch.runtime.launcher import advertise_host_for  # pylint: disable=import-outside-toplevel
        from launch.runtime.ray_backend import import_ray  # pylint: disable=import-outside-toplevel

        # $RAY_ADDRESS means the same as --ray-address (Ray itself would read it), and
        # beats the address a resumed run stored: the cluster may have moved since.
        if "ray_address" not in given and os.environ.get("RAY_ADDRESS"):
            args.ray_address = os.environ["RAY_ADDRESS"]
        # Fail fast, before the heavier checks, if Ray is missing.
        import_ray(
            loopback=args.ray_address is None and advertise_host_for(args.bind_host) is not None
        )

    saved = run_dir.read_identity() if run_dir else None

    try:
        if saved is not None and saved.get("program") == "d4pg" and args.preset is None:
            base = D4PGConfig.from_saved(saved.get("config", {}))  # Resume: the run's own settings.
        else:
            base = D4PGConfig.from_overrides(d4pg_program.PRESETS[args.preset or "quick"])
        config = D4PGConfig.from_overrides(overrides, base=base)
    except ValueError as e:
        raise LaunchError(f"{e}. Set keys as --config.KEY=VALUE.") from None

    task = args.env or (saved or {}).get("task") or d4pg_program.D4PGProgramSettings().task
    import environments  # pylint: disable=import-outside-toplevel

    try:
        environments.parse_task_name(task)
    except environments.UnknownTaskError as e:
        raise LaunchError(str(e)) from None

    learner_gpus, ray_resources, replicas = _check_learner(args, config)
    config = _pin_replay_layout(config, replicas)
    if args.show_config:  # After the layout is resolved for the learner's replicas.
        raise LaunchError(
            "\n".join(
                f"--config.{k}={_flag_value(v)}" for k, v in sorted(config.to_dict().items())
            ),
            exit_code=0,
        )

    run_dir = run_dir or RunDir(_default_run_dir(task))
    identity = d4pg_program.identity(task, config.to_dict())
    resuming = run_dir.check_compatible(
        identity, ignore=d4pg_program.RESUMABLE_CONFIG_KEYS, fallbacks=SAVED_CONFIG_FALLBACKS
    )
    if args.replay_port:
        _check_port_free(args.replay_port)
    settings = d4pg_program.D4PGProgramSettings(
        task=task,
        num_actors=args.actors,
        envs_per_actor=args.envs_per_actor,
        learner_replicas=args.learner_replicas,
        replay_port=args.replay_port,
        learner_checkpoint_every_steps=args.checkpoint_every,
        replay_checkpoint_every_s=args.replay_checkpoint_every,
        eval_every_s=args.eval_every or d4pg_program.D4PGProgramSettings.eval_every_s,
        eval_every_steps=None
        if args.eval_every is not None
        else (args.eval_every_steps or max(1000, args.steps // 20)),
        keep_snapshots=args.keep_snapshots,
        eval_episodes=args.eval_episodes,
        learner_workers=args.learner_workers,
        learner_gpus=learner_gpus,
        ray_resources=ray_resources,
        max_restarts=args.max_restarts,
        restart_window_s=args.restart_window * 60.0,
    )
    return settings, config, identity, run_dir, resuming, args, given


def _pin_replay_layout(config, replicas: int):
    """`config` with its transitions per replay item fixed for `replicas` learner replicas
    (stored with the run, so a resume keeps the table layout it wrote)."""
    group = config.resolved_transitions_per_item(replicas)
    per_replica = config.batch_size // replicas
    if per_replica % group:
        raise LaunchError(
            f"--config.batch_size={config.batch_size} gives each of the {replicas} learner "
            f"replicas {per_replica} transitions, not a multiple of "
            f"--config.transitions_per_item={group} (whole items per replica): set "
            f"--config.batch_size={replicas * group * max(1, per_replica // group)} or a "
            "smaller --config.transitions_per_item."
        )
    return config.with_pinned_layout(replicas)


def _check_learner(args, config) -> tuple[float, dict[str, dict[str, float]], int]:
    """Validates the learner layout; returns GPUs per learner worker, Ray resources and
    the learner's replica count (all workers)."""
    from launch.d4pg import program as d4pg_program  # pylint: disable=import-outside-toplevel
    from launch.runtime import learner_group  # pylint: disable=import-outside-toplevel
    from launch.runtime import resources as res  # pylint: disable=import-outside-toplevel

    spec, workers = args.learner_replicas.strip().lower(), args.learner_workers
    try:
        import replication  # pylint: disable=import-outside-toplevel

        kind = replication.parse(spec).kind
    except ValueError as e:
        raise LaunchError(f"--learner-replicas: {e}") from None
    if kind in ("multiworker", "ps", "tpu"):
        raise LaunchError(
            f"--learner-replicas {spec} is not supported by `launch d4pg`: it takes each "
            "learner worker's local spec (cpu, cpu:N, gpu, gpu:N); for a learner across "
            "processes or machines use --learner-workers K (synchronous multi-worker)."
        )
    if workers > 1 and args.backend == "threads":
        raise LaunchError(
            "--learner-workers > 1 needs one process per worker; use --backend local or ray."
        )
    reason = learner_group.check_local_spec(spec, workers)
    if reason:
        raise LaunchError(reason)
    on_cluster = args.backend == "ray" and args.ray_address is not None
    gpus = res.learner_gpus(
        spec, workers, args.backend, None if on_cluster else res.local_gpu_ids()
    )
    total = d4pg_program.learner_replica_count(spec, workers, gpus)
    replicas = total // workers
    if config.batch_size % total:
        raise LaunchError(
            f"--config.batch_size={config.batch_size} must be divisible by the {total} learner "
            f"replicas ({workers} worker(s) x {replicas} of {spec}); e.g. "
            f"--config.batch_size={max(total, config.batch_size // total * total)}."
        )
    ray_resources = res.parse_ray_resources(args.ray_resources or [])
    from launch.runtime.launcher import advertise_host_for  # pylint: disable=import-outside-toplevel
    from launch.runtime.ray_cluster import pin_to_ip, pins_servers  # pylint: disable=import-outside-toplevel

    host = advertise_host_for(args.bind_host)
    if args.backend == "ray" and pins_servers(host):
        for role in ("replay", "learner"):  # The nodes that serve: run them on that IP.
            ray_resources.setdefault(role, {}).update(pin_to_ip(host))
    return gpus, ray_resources, total


def _launch_d4pg(raw_args) -> int:
    import shutil  # pylint: disable=import-outside-toplevel

    from launch import (
        quiet,  # pylint: disable=import-outside-toplevel
        run_settings,  # pylint: disable=import-outside-toplevel
    )
    from launch.d4pg import program as d4pg_program  # pylint: disable=import-outside-toplevel
    from launch.runtime import launcher  # pylint: disable=import-outside-toplevel
    from launch.runtime.metrics import Progress  # pylint: disable=import-outside-toplevel
    from launch.runtime.run_dir import LOCK_FILES  # pylint: disable=import-outside-toplevel

    settings, config, identity, run_dir, resuming, args, given = _resolve_d4pg(
        raw_args, raw_args.config_overrides
    )
    created = not os.path.exists(run_dir.root)
    # The object holding the lock: `run_dir` is resolved again below, as a new object.
    locked = run_dir
    locked.lock(wait_for_nodes_s=_PREVIOUS_NODES_WAIT_S, notify=lambda m: print(m, flush=True))
    # Ours to remove on failure only if nobody else wrote into it before we locked it.
    created = created and set(os.listdir(run_dir.root)) <= LOCK_FILES
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
        locked.unlock()
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
        f"  export:   {_PROG} export --run-dir {run_dir.root} --out POLICY_DIR\n"
        f"  plot:     {_PROG} plot {run_dir.root}\n"
        f"  resume:   {_PROG} launch d4pg --run-dir {run_dir.root} --steps N"
    )
    return EXIT_INTERRUPTED if outcome.reason == "interrupted" else 0


def _evaluate(args) -> int:
    import json  # pylint: disable=import-outside-toplevel

    from launch.reporting import evaluate  # pylint: disable=import-outside-toplevel

    if args.episodes < 1:
        raise LaunchError("--episodes must be at least 1.")
    if args.seed is not None and args.seeds is not None:
        raise LaunchError("pass --seeds (one or more), not --seed with it.")
    seeds = args.seeds or ([args.seed] if args.seed is not None else [12345])
    if args.all_snapshots:
        if args.run_dir is None or args.snapshot or args.step is not None or args.video:
            raise LaunchError(
                "--all-snapshots evaluates every snapshot of --run-dir: drop --snapshot, "
                "--step and --video."
            )
        out = args.out or os.path.join(args.run_dir, "snapshot_returns.csv")
        rows = evaluate.evaluate_all(
            args.run_dir,
            out,
            task=args.env,
            episodes=args.episodes,
            seeds=seeds,
            echo=None if args.json else print,
        )
        if args.json:
            print(json.dumps({"csv": os.path.abspath(out), "snapshots": rows}))
        else:
            print(f"{len(rows)} snapshot(s) evaluated: {os.path.abspath(out)}")
        return 0
    if args.out:
        raise LaunchError("--out names the CSV of --all-snapshots; use --video for a video.")
    result = evaluate.evaluate(
        args.run_dir,
        snapshot=args.snapshot,
        step=args.step,
        task=args.env,
        episodes=args.episodes,
        seeds=seeds,
        video=args.video,
    )
    if args.video:
        result["video"] = os.path.abspath(args.video)
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['task']}: return over {result['episodes']} episode(s): mean "
        f"{result['mean']:.1f}, std {result['std']:.1f} (learner step "
        f"{result['learner_step']:,}; seeds {' '.join(map(str, result['seeds']))})"
    )
    if args.video:
        print(f"video of episode 1: {result['video']}")
    return 0


def _export(args) -> int:
    from launch.d4pg import snapshots  # pylint: disable=import-outside-toplevel

    out, step = snapshots.export(args.run_dir, args.out, args.step)
    print(
        f"policy snapshot of learner step {step:,}: {os.path.abspath(out)}\n"
        f"  load it: policy = tf.saved_model.load({out!r}); actions = policy.act(observations)"
    )
    return 0


def _plot(args) -> int:
    from launch.reporting import plot  # pylint: disable=import-outside-toplevel

    runs = list(args.runs) + ([args.run_dir] if args.run_dir else [])
    print(
        plot.plot(
            runs,
            args.out,
            metric=args.metric,
            group_by=plot.parse_group_by(args.group_by),
            reference=plot.parse_references(args.reference),
        )
    )
    return 0


def _list_tasks(args) -> int:
    del args
    import environments  # pylint: disable=import-outside-toplevel

    print("\n".join(environments.list_tasks()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `replicator` console script; returns the exit status."""
    from launch import quiet  # pylint: disable=import-outside-toplevel

    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv[: argv.index("--") if "--" in argv else len(argv)]
    argv = [a for a in argv if a != "--verbose"]
    os.environ.setdefault("MUJOCO_GL", "egl")
    command = next((a for a in argv if not a.startswith("-")), "")
    with quiet.console(verbose, command):
        return _main(argv)


def _main(argv: list[str]) -> int:
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
