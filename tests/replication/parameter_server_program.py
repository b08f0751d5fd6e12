"""Asynchronous parameter-server training on a localhost cluster (see test_parameter_server.py).

Usage: python parameter_server_program.py OUT.npz PS_PORT WORKER_PORT WORKER_PORT
Starts one parameter server and two workers as separate processes serving gRPC
on localhost, coordinates from this process, trains the toy regression
asynchronously and writes the final loss and step count to OUT.npz.
(In-process servers sharing the coordinator's process deadlock on this 2-core
machine; separate processes are also what a real cluster runs.)
"""

import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

STEPS = int(os.environ.get("PS_STEPS", "300"))
SERVER = (
    "import json, sys, tensorflow as tf; "
    "tf.distribute.Server(tf.train.ClusterSpec(json.loads(sys.argv[1])), job_name=sys.argv[2], "
    "task_index=int(sys.argv[3]), protocol='grpc', start=True).join()"
)


def start_servers(cluster: dict) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(cluster), job, str(i)])
        for job in ("ps", "worker")
        for i in range(len(cluster[job]))
    ]


def train(out: str, cluster: dict) -> None:
    import tensorflow as tf

    import replication

    sys.path.insert(0, os.path.dirname(__file__))
    from toy_regression import build, data, loss_fn

    repl = replication.make("ps", cluster=cluster)
    x, y = data(steps=32, noise=0.1)
    model, opt = build(repl, learning_rate=0.05)

    def input_fn(ctx):
        # The pipeline is built once on each worker; a random draw made while building
        # it tags that worker's batches, so the results say which worker ran each step
        # (on `ps` every worker sees input_pipeline_id 0).
        tag = tf.data.Dataset.from_tensors(
            tf.random.uniform([], maxval=2**62, dtype=tf.int64)
        ).repeat()
        batches = (
            tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(256, seed=ctx.input_pipeline_id)
            .repeat()
            .batch(ctx.get_per_replica_batch_size(16))
        )
        return tf.data.Dataset.zip((batches, tag)).map(lambda xy, t: (xy[0], xy[1], t))

    per_worker = iter(repl.distribute(input_fn))

    @tf.function
    def train_step(iterator):
        def step(xb, yb, worker_tag):
            with tf.GradientTape() as tape:
                loss = loss_fn(model, xb, yb)
            opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            return worker_tag

        return repl.run(step, *next(iterator))

    initial = float(loss_fn(model, x, y))
    results = [repl.schedule(train_step, per_worker) for _ in range(STEPS)]
    repl.join()
    _, workers = np.unique([int(r.fetch()) for r in results], return_inverse=True)
    np.savez(
        out,
        initial=initial,
        final=float(loss_fn(model, x, y)),
        steps=int(opt.optimizer.step.numpy()),
        asynchronous=repl.is_asynchronous,
        steps_per_worker=np.bincount(workers, minlength=len(cluster["worker"])),
    )


def main() -> None:
    out, ps_port, *worker_ports = sys.argv[1:]
    cluster = {"ps": [f"localhost:{ps_port}"], "worker": [f"localhost:{p}" for p in worker_ports]}
    servers = start_servers(cluster)
    code = 1
    try:
        train(out, cluster)
        code = 0
    finally:
        for server in servers:
            server.kill()
            server.wait()
        sys.stdout.flush()
        sys.stderr.flush()
        # The coordinator's background threads retry the now-dead servers for a
        # long time at interpreter exit; the result is written, so leave at once.
        os._exit(code)


if __name__ == "__main__":
    main()
