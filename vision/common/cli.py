"""What the `replicator train MODEL` commands share: flags, config resolution, errors, workers.

A trainer's CLI module defines its own flags and calls:

    add_run_flags(parser, defaults)       # --data --replicas --run-dir --batch-size --steps ...
    resolve(defaults, saved, args, flags) # defaults <- the run directory's config <- given flags
    run_command(...)                      # usage errors (exit 2), divergence (exit 1), --workers

Every flag defaults to None, meaning "not given", so a resumed run keeps the
values saved in its run directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vision.common import run_dir as run_dir_lib
from vision.common.workers import WorkerRole, spawn


class ConfigError(ValueError):
    """A config value that cannot work; the message names it and what to use."""


def ints(text: str) -> tuple[int, ...]:
    """argparse type: "3,4,6,3" -> (3, 4, 6, 3)."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def floats(text: str) -> tuple[float, ...]:
    """argparse type: "0.3,0.6" -> (0.3, 0.6)."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


def boolean(text: str) -> bool:
    """argparse type: true/false, yes/no, on/off, 1/0."""
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_run_flags(parser: argparse.ArgumentParser, kind: str, defaults: Mapping[str, Any]) -> None:
    """The flags every trainer has: data, hardware, run directory, length, cadence, workers."""
    add = parser.add_argument
    add(
        "--replicas",
        help="replication spec of each worker: cpu, cpu:N, gpu, multiworker, tpu "
        f"(default: {defaults['replicas']})",
    )
    add(
        "--workers",
        type=int,
        metavar="K",
        help="train as K processes on this machine forming one multi-worker strategy "
        "(each uses its local devices: one CPU, or its GPUs); only worker 0 writes the run "
        "directory (default: 1)",
    )
    add("--run-dir", help=f"run directory (default: runs/{kind}-<time>); reusing one resumes")
    add(
        "--seed",
        type=int,
        help=f"initialisation, data order and noise seed (default: {defaults['seed']})",
    )
    add(
        "--log-every",
        type=int,
        help=f"steps between progress lines (default: {defaults['log_every']})",
    )
    add("--checkpoint-every", type=int, help=f"(default: {defaults['checkpoint_every']})")
    add("--keep-checkpoints", type=int, help=f"(default: {defaults['keep_checkpoints']})")
    add(
        "--stop-at",
        type=int,
        metavar="STEP",
        help="end this invocation at STEP with a checkpoint, as if preempted (schedules "
        "still span --steps); rerun to continue",
    )
    add("--worker", help=argparse.SUPPRESS)  # set by --workers for each process it starts


def resolve(
    defaults: Mapping[str, Any],
    saved: Mapping[str, Any] | None,
    args: argparse.Namespace,
    flags: Mapping[str, str],
) -> dict[str, Any]:
    """Defaults <- the run directory's saved config <- flags given on the command line."""
    values = dict(defaults)
    values.update({k: v for k, v in (saved or {}).items() if k in values})
    for flag, field in flags.items():
        given = getattr(args, flag, None)
        if given is not None:
            values[field] = given
    return values


def usage_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean "the command line asked for something impossible"."""
    # pylint: disable=import-outside-toplevel
    import replication
    from vision.data import DataError
    from vision.metrics.gan import ClassifierExportError

    return (
        ConfigError,
        DataError,
        ClassifierExportError,
        run_dir_lib.RunDirError,
        replication.BatchSplitError,
        replication.DeploymentSpecError,
    )


def run_command(
    args: argparse.Namespace,
    *,
    kind: str,
    module: str,
    config_from_args: Callable[[argparse.Namespace], Any],
    config_to_dict: Callable[[Any], dict[str, Any]],
    config_from_dict: Callable[[dict[str, Any]], Any],
    global_batch: Callable[[Any], int],
    train: Callable[..., Any],
) -> int:
    """Runs a `train MODEL` command; returns the exit status (0 done, 2 usage error, 1 diverged).

    Args:
      args: the parsed flags (with `run_dir`, `workers`, `worker`, `stop_at`).
      kind: the model's name ("resnet50", "sngan").
      module: the CLI module, run as `python -m MODULE train KIND` for each worker.
      config_from_args: resolves and validates the config (raises usage errors).
      config_to_dict, config_from_dict: the config as JSON values (sent to workers).
      global_batch: the config's global batch size.
      train: `train(config, run_dir=..., repl=..., stop_at=..., worker=WorkerRole | None)`.
    """
    prog = f"replicator train {kind}"
    if not args.run_dir:
        args.run_dir = os.path.join("runs", time.strftime(f"{kind}-%Y%m%d-%H%M%S"))
    args.run_dir = os.path.abspath(args.run_dir)
    role = None
    try:
        import replication  # pylint: disable=import-outside-toplevel

        if args.worker:  # one of the processes of --workers K
            role, values, stop_at = WorkerRole.from_json(args.worker)
            config = config_from_dict(values)
            repl = replication.make(
                "multiworker", workers=list(role.addresses), task_index=role.index
            )
        else:
            if args.workers is not None and args.workers < 1:
                raise ConfigError(f"--workers must be at least 1 (got {args.workers}).")
            config = config_from_args(args)
            stop_at = args.stop_at
            if config.workers > 1:
                return _spawn_workers(args, kind, module, config, config_to_dict, global_batch)
            try:
                repl = replication.make(config.replicas)
            except RuntimeError as error:  # e.g. 'gpu' without a GPU, devices set too late
                raise ConfigError(str(error)) from None
            role = role_from_tf_config() if config.replicas == "multiworker" else None
        train(config, run_dir=args.run_dir, repl=repl, stop_at=stop_at, worker=role)
    except usage_errors() as error:
        print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
        return 2
    except FloatingPointError as error:
        print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
        return 1
    if not args.worker and (role is None or role.chief):  # --workers: the parent says it
        print(closing_lines(args.run_dir))
    return 0


def closing_lines(run_dir: str) -> str:
    """What a finished run left and where: the run directory, then one line per product
    that exists (sample grid, metrics, TensorBoard), as the D4PG launch ends with hints."""
    lines = [f"Run directory: {run_dir}"]
    samples = os.path.join(run_dir, "samples.png")
    if os.path.exists(samples):
        lines.append(f"  samples:     {samples}  (the EMA generator's latest grid)")
    metrics = os.path.join(run_dir, run_dir_lib.METRICS_FILE)
    if os.path.exists(metrics):
        lines.append(f"  metrics:     {metrics}")
    tensorboard = os.path.join(run_dir, run_dir_lib.TENSORBOARD)
    if os.path.isdir(tensorboard):
        lines.append(f"  TensorBoard: tensorboard --logdir {tensorboard}")
    return "\n".join(lines)


def role_from_tf_config() -> WorkerRole | None:
    """This process's role in a multi-host run described by TF_CONFIG (None: no cluster).

    The chief is the "chief" task if the cluster has one, else worker 0.
    """
    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    cluster, task = config.get("cluster", {}), config.get("task", {})
    if not cluster or not task:
        return None
    addresses = tuple(cluster.get("chief", []) + cluster.get("worker", []))
    index = int(task.get("index", 0))
    if task.get("type") == "worker":
        index += len(cluster.get("chief", []))
    return WorkerRole(index, addresses)


def _spawn_workers(args, kind, module, config, config_to_dict, global_batch) -> int:
    workers = config.workers
    if config.replicas not in ("cpu", "gpu", "multiworker"):
        raise ConfigError(
            f"--workers {workers} runs each worker on its local devices (one CPU, or its "
            f"GPUs); --replicas {config.replicas} cannot be combined with it: leave "
            "--replicas out or pass --replicas multiworker."
        )
    batch = global_batch(config)
    if batch % workers:
        raise ConfigError(
            f"Global batch size {batch} is not divisible by the {workers} workers; use a "
            f"multiple of {workers} (e.g. {max(workers, batch // workers * workers)})."
        )
    values = config_to_dict(config)
    values["replicas"] = "multiworker"
    values["workers"] = workers
    command = [sys.executable, "-m", module, "train", kind, "--run-dir", args.run_dir]
    try:
        code = spawn(command, workers, values, args.stop_at)
    except ValueError as error:  # e.g. fewer GPUs than workers
        raise ConfigError(str(error)) from None
    if code == 0:
        print(closing_lines(args.run_dir))
    return code


def main(
    register: Callable[[Any], argparse.ArgumentParser], module: str, argv: Sequence[str] | None
) -> int:
    """`python -m MODULE train MODEL ...` (the same as `replicator train MODEL ...`)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train")
    register(train.add_subparsers(dest="model", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
