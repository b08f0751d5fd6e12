"""`--workers K`: one training run as K processes on this machine, one multi-worker strategy.

`spawn` starts K copies of a trainer's CLI, each told its index and every
worker's loopback address; each builds `replication.make("multiworker",
workers=..., task_index=i)` (MultiWorkerMirroredStrategy: gRPC collectives
between the processes, each process using its local devices: one CPU without
GPUs; the machine's GPUs are dealt out between the workers through
CUDA_VISIBLE_DEVICES, so no two processes share one). The global batch is split
over all K x local replicas.

Only worker 0, the chief, writes into the run directory (config, metrics,
TensorBoard, checkpoints, samples); the other workers read the saved config
and restore the chief's checkpoints. Their output goes to a temporary file,
shown only if one of them fails.

Stopping: a SIGTERM/SIGINT to this process is passed to the chief, which
checkpoints at the next step boundary and exits; the other workers, which then
wait for a peer that is gone, are ended. If any worker fails, the others are
ended too (collectives cannot continue without a member).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import vision

# Seconds the other workers get to finish after the chief has exited.
_GRACE_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class WorkerRole:
    """This process's place in a multi-worker run."""

    index: int
    addresses: tuple[str, ...]

    @property
    def chief(self) -> bool:
        return self.index == 0

    def to_json(self, config: dict[str, Any], stop_at: int | None) -> str:
        return json.dumps(
            {
                "index": self.index,
                "addresses": list(self.addresses),
                "config": config,
                "stop_at": stop_at,
            }
        )

    @staticmethod
    def from_json(text: str) -> tuple[WorkerRole, dict[str, Any], int | None]:
        value = json.loads(text)
        role = WorkerRole(int(value["index"]), tuple(value["addresses"]))
        return role, value["config"], value.get("stop_at")


def loopback_addresses(count: int) -> list[str]:
    """`count` "127.0.0.1:PORT" addresses with ports that were free a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def split_gpus(gpus: Sequence[str], workers: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each worker: the GPUs dealt out in contiguous groups.

    Two processes must never both take all of a GPU's memory, so each worker sees
    only its own GPUs (None: no GPUs at all, leave the variable alone).

    Raises:
      ValueError: fewer GPUs than workers.
    """
    if not gpus:
        return [None] * workers
    if len(gpus) < workers:
        raise ValueError(
            f"{workers} workers need at least {workers} GPUs but {len(gpus)} are visible "
            f"({','.join(gpus)}); use fewer --workers, or --replicas gpu in one process."
        )
    per_worker, extra = divmod(len(gpus), workers)
    groups, start = [], 0
    for index in range(workers):
        size = per_worker + (index < extra)
        groups.append(",".join(gpus[start : start + size]))
        start += size
    return groups


def visible_gpus() -> list[str]:
    """This machine's GPU ids as CUDA numbers them (CUDA_VISIBLE_DEVICES, else nvidia-smi)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)  # the cluster is given explicitly
    root = os.path.dirname(os.path.dirname(os.path.abspath(vision.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def spawn(
    command: Sequence[str],
    workers: int,
    config: dict[str, Any],
    stop_at: int | None,
    print_fn: Callable[[str], None] = print,
) -> int:
    """Runs `command + ["--worker", ROLE]` as `workers` processes; returns the exit status.

    The status is the chief's, or that of the first worker that failed.
    """
    gpus = split_gpus(visible_gpus(), workers)
    addresses = tuple(loopback_addresses(workers))
    logs, processes = [], []
    for index in range(workers):
        env = _child_env()
        if gpus[index] is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus[index]
        role = WorkerRole(index, addresses)
        argv = [*command, "--worker", role.to_json(config, stop_at)]
        if index == 0:  # the chief speaks for the run
            out = None
        else:
            out = tempfile.TemporaryFile(mode="w+", prefix=f"worker{index}-")
            logs.append(out)
        processes.append(subprocess.Popen(argv, env=env, stdout=out, stderr=out, text=True))
    previous = {}
    stopping = []

    def forward(signum, frame):
        del frame
        stopping.append(signum)
        if processes[0].poll() is None:
            processes[0].send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous[sig] = signal.signal(sig, forward)
        except ValueError:  # not the main thread: no forwarding
            pass
    try:
        return _wait(processes, logs, print_fn, stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for log in logs:
            log.close()


def _wait(processes, logs, print_fn, stopping) -> int:
    chief_done_at = None
    while True:
        codes = [p.poll() for p in processes]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            index = failed[0]
            if index != 0 and codes[0] in (None, 0):
                logs[index - 1].seek(0)
                tail = logs[index - 1].read()[-3000:]
                print(f"worker {index} exited with status {codes[index]}:\n{tail}", file=sys.stderr)
            return codes[index]
        if all(code == 0 for code in codes):
            return 0
        if codes[0] == 0:
            chief_done_at = chief_done_at or time.monotonic()
            # After a stop the others wait for the chief in a collective: end them now.
            if stopping or time.monotonic() - chief_done_at > _GRACE_SECONDS:
                print_fn("The chief has finished; ending the other workers.")
                return 0
        time.sleep(0.2)
