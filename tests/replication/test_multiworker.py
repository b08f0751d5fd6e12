"""Two worker processes on localhost form one replicated computation."""

import subprocess
import sys
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


def test_two_workers_match_one_process_with_the_global_batch(tmp_path):
    workers = [f"localhost:{free_port()}", f"localhost:{free_port()}"]
    outputs = [tmp_path / f"worker{i}.npz" for i in range(2)]
    processes = [
        subprocess.Popen(
            [sys.executable, str(PROGRAM), str(i), str(outputs[i]), *workers],
            env=python_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for process in processes:
            logs.append(process.communicate(timeout=240)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert [p.returncode for p in processes] == [0, 0], "\n".join(log[-3000:] for log in logs)

    ref_losses, ref_params = single_process_reference()
    for output in outputs:
        result = np.load(output)
        assert int(result["replicas"]) == 2
        assert float(result["id_sum"]) == 3.0  # replica ids 0 and 1, plus one each
        np.testing.assert_allclose(result["losses"], ref_losses, rtol=1e-5)
        for i, reference in enumerate(ref_params):
            np.testing.assert_allclose(result[f"param{i}"], reference, rtol=1e-5, atol=1e-6)
