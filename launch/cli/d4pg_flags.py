"""The flags of `replicator launch d4pg` and their checks, run before anything is written.

`add_flags` declares them; `resolve` validates a parsed command line against the run
directory's stored settings and returns the program settings, config and identity.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import time

from launch.cli.common import flag_value
from launch.runtime.errors import LaunchError


def add_flags(d4pg: argparse.ArgumentParser) -> None:
    """Declares the flags of `launch d4pg` on its parser."""
    from launch.d4pg import program as d4pg_program  # pylint: disable=import-outside-toplevel
    from launch.runtime.launcher import BACKENDS  # pylint: disable=import-outside-toplevel

    defaults = d4pg_program.D4PGProgramSettings()
    # Flags a run remembers (launch.cli.run_settings) default to None = "not given"; their
    # help says the default of a new run.
    own = ", or the run's own when resuming"
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
        "--learner-intra-op-threads",
        type=int,
        default=None,
        metavar="N",
        help="threads one TensorFlow op of a learner process may use, its compiled XLA "
        "update included; 0: TensorFlow's default, one per core (default: 1 for one worker "
        "of one cpu replica on feature observations, where actors share the cores, else "
        f"0{own})",
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
        help="actor steps budget of the run, counted over relaunches; the quick preset's "
        "learning rates decay over a new run's budget "
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
        help="policy snapshots (RUN/snapshots/step_N, written with a learner checkpoint) "
        f"to keep (default: {defaults.keep_snapshots}{own})",
    )
    d4pg.add_argument(
        "--snapshot-every",
        type=float,
        default=None,
        metavar="SECONDS",
        help="write a policy snapshot with the first learner checkpoint this long after the "
        "last one, and with the final checkpoint "
        f"(default: {defaults.learner_snapshot_every_s:g}{own})",
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
        "--learner-stall-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --learner-workers > 1: a worker that completes no update for this long "
        "is stuck (e.g. in an all-reduce with a hung peer) and the learner group restarts "
        f"from its last checkpoint; 0: never (default: {defaults.learner_stall_timeout_s:g}{own})",
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


def default_run_dir(task: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"d4pg-{task.replace(':', '-')}-{stamp}")


def check_port_free(port: int) -> None:
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


def resolve(raw_args, overrides: dict[str, str]):
    """Validates everything a D4PG launch needs; writes nothing. Returns its pieces.

    Flags not given take the run's stored values (`launch.cli.run_settings`); `raw_args`
    is left as parsed, so the resolution can be repeated under the run dir's lock.
    """
    from agents.d4pg.config import (  # pylint: disable=import-outside-toplevel
        SAVED_CONFIG_FALLBACKS,
        D4PGConfig,
    )
    from launch.cli import run_settings  # pylint: disable=import-outside-toplevel
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
    if args.snapshot_every <= 0:
        raise LaunchError("--snapshot-every must be a positive number of seconds.")
    if args.keep_snapshots < 1:
        raise LaunchError("--keep-snapshots must be at least 1.")
    if not 0 <= args.replay_port <= 65535:
        raise LaunchError("--replay-port must be between 0 and 65535.")
    if args.replay_checkpoint_every <= 0:
        raise LaunchError("--replay-checkpoint-every must be a positive number of seconds.")
    if args.max_restarts < 0:
        raise LaunchError("--max-restarts must be 0 or more.")
    if args.learner_stall_timeout < 0:
        raise LaunchError("--learner-stall-timeout must be 0 (never) or a number of seconds.")
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
    task = args.env or (saved or {}).get("task") or d4pg_program.D4PGProgramSettings().task
    import environments  # pylint: disable=import-outside-toplevel

    try:
        environments.parse_task_name(task)
    except environments.UnknownTaskError as e:
        raise LaunchError(str(e)) from None

    try:
        preset = None
        args.preset_task_values = {}
        if saved is not None and saved.get("program") == "d4pg" and args.preset is None:
            base = D4PGConfig.from_saved(saved.get("config", {}))  # Resume: the run's own settings.
        else:
            preset = args.preset or "quick"
            base = D4PGConfig.from_overrides(d4pg_program.PRESETS[preset])
        config = D4PGConfig.from_overrides(overrides, base=base)
        # The preset's values for this task (features only) sit under the user's overrides.
        task_values = (
            d4pg_program.preset_task_values(preset, task, config.from_pixels) if preset else {}
        )
        if task_values:
            base = D4PGConfig.from_overrides(task_values, base=base)
            config = D4PGConfig.from_overrides(overrides, base=base)
            args.preset_task_values = {k: v for k, v in task_values.items() if k not in overrides}
        decays_over_budget = preset in d4pg_program.LR_DECAY_OVER_BUDGET_PRESETS
        if decays_over_budget and "lr_decay_updates" not in overrides:
            # The preset's rates decay over this run's budget; a resume reads it back.
            span = d4pg_program.updates_in_budget(config, args.steps)
            config = D4PGConfig.from_overrides({"lr_decay_updates": span}, base=config)
        if config.sigma_final_scale != 1.0 and config.lr_decay_updates == 0:
            raise ValueError(
                "sigma_final_scale follows the learning rates' decay, and this run's rates are "
                "constant: set lr_decay_updates > 0 too, or use the quick preset (its rates "
                "decay over --steps)"
            )
    except ValueError as e:
        raise LaunchError(f"{e}. Set keys as --config.KEY=VALUE.") from None

    learner_gpus, ray_resources, replicas = check_learner(args, config)
    config = pin_replay_layout(config, replicas)
    if args.show_config:  # After the layout is resolved for the learner's replicas.
        raise LaunchError(
            "\n".join(f"--config.{k}={flag_value(v)}" for k, v in sorted(config.to_dict().items())),
            exit_code=0,
        )

    run_dir = run_dir or RunDir(default_run_dir(task))
    identity = d4pg_program.identity(task, config.to_dict())
    resuming = run_dir.check_compatible(
        identity, ignore=d4pg_program.RESUMABLE_CONFIG_KEYS, fallbacks=SAVED_CONFIG_FALLBACKS
    )
    if args.replay_port:
        check_port_free(args.replay_port)
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
        learner_snapshot_every_s=args.snapshot_every,
        eval_episodes=args.eval_episodes,
        learner_workers=args.learner_workers,
        learner_gpus=learner_gpus,
        learner_intra_op_threads=args.learner_intra_op_threads,
        ray_resources=ray_resources,
        learner_stall_timeout_s=args.learner_stall_timeout,
        max_restarts=args.max_restarts,
        restart_window_s=args.restart_window * 60.0,
    )
    return settings, config, identity, run_dir, resuming, args, given


def pin_replay_layout(config, replicas: int):
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


def check_learner(args, config) -> tuple[float, dict[str, dict[str, float]], int]:
    """Validates the learner layout; returns GPUs per learner worker, Ray resources and
    the learner's replica count (all workers)."""
    from launch.d4pg import program as d4pg_program  # pylint: disable=import-outside-toplevel
    from launch.runtime import learner_group  # pylint: disable=import-outside-toplevel
    from launch.runtime import resources as res  # pylint: disable=import-outside-toplevel

    if args.learner_intra_op_threads is not None and args.learner_intra_op_threads < 0:
        raise LaunchError(
            f"--learner-intra-op-threads must be >= 0 (0: TensorFlow's default), got "
            f"{args.learner_intra_op_threads}"
        )
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
