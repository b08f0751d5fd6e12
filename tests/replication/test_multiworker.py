"""Two worker processes on localhost form one replicated computation."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

import replication
from tests.replication.toy_regression import GLOBAL_BATCH, build, data, train_step_fn
from tests.support import free_port, python_env

PROGRAM = Path(__file__).with_name("multiworker_program.py")


def single_process_reference():
    repl = replication.make("cpu")
    x, y = data()
    model, opt = build(repl)
    iterator = iter(
        repl.distribute(lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))
    )
    step = train_step_fn(repl, model, opt)
    losses = [float(step(iterator)) for _ in range(5)]
    return losses, [v.numpy() for v in model.trainable_variables]


def _start_workers(outputs, **env):
    workers = [f"localhost:{free_port()}", f"localhost:{free_port()}"]
    return [
        subprocess.Popen(
            [sys.executable, str(PROGRAM), str(i), str(outputs[i]), *workers],
            env=python_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]


def _kill_running(processes) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def _finish(processes) -> list[str]:
    """Each worker's output, once both have exited (killed after 240 s)."""
    logs = []
    try:
        for process in processes:
            logs.append(process.communicate(timeout=240)[0])
    finally:
        _kill_running(processes)
    assert [p.returncode for p in processes] == [0, 0], "\n".join(log[-3000:] for log in logs)
    return logs


def test_two_workers_match_one_process_with_the_global_batch(tmp_path):
    outputs = [tmp_path / f"worker{i}.npz" for i in range(2)]
    _finish(_start_workers(outputs))

    ref_losses, ref_params = single_process_reference()
    for output in outputs:
        result = np.load(output)
        assert int(result["replicas"]) == 2
        assert float(result["id_sum"]) == 3.0  # replica ids 0 and 1, plus one each
        np.testing.assert_allclose(result["losses"], ref_losses, rtol=1e-5)
        for i, reference in enumerate(ref_params):
            np.testing.assert_allclose(result[f"param{i}"], reference, rtol=1e-5, atol=1e-6)


def test_a_worker_paused_for_20_seconds_does_not_fail_the_group(tmp_path):
    # A loaded machine can starve a worker of its heartbeats for longer than TensorFlow's
    # default 10 s; the coordination service then aborts the whole group. `make` gives
    # the service 60 s, so a worker frozen for 20 s mid-training only delays its peer.
    outputs = [tmp_path / f"worker{i}.npz" for i in range(2)]
    processes = _start_workers(outputs, MORE_STEPS="40")
    try:
        deadline = time.monotonic() + 180
        while not outputs[1].exists():  # Written before the 40 more steps.
            assert time.monotonic() < deadline and processes[1].poll() is None, "no output"
            time.sleep(0.2)
        os.kill(processes[1].pid, signal.SIGSTOP)
        try:
            time.sleep(20)
        finally:
            os.kill(processes[1].pid, signal.SIGCONT)
    except BaseException:
        _kill_running(processes)
        raise
    logs = _finish(processes)
    assert all("finished 40 more steps" in log for log in logs), logs[0][-3000:]
