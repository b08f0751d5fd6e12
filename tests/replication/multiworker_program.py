"""One worker of a two-process multi-worker run (started by test_multiworker.py).

Usage: python multiworker_program.py TASK_INDEX OUT.npz HOST:PORT HOST:PORT
Trains the shared toy regression for a few steps with per-worker batch 4 and
writes the final parameters and one cross-worker all-reduce to OUT.npz.
With MORE_STEPS=N in the environment it then makes N more steps, 0.25 s apart (a window
in which the test may pause a worker), and prints "finished N more steps".
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import replication

sys.path.insert(0, os.path.dirname(__file__))
from toy_regression import GLOBAL_BATCH, build, data, train_step_fn


def main() -> None:
    task_index, out, workers = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    repl = replication.make(
        "multiworker", workers=workers, task_index=task_index, collective_timeout=60
    )
    x, y = data()
    model, opt = build(repl)

    def input_fn(ctx):
        # Pipeline i reads rows [i*b, (i+1)*b) of every global batch, so the two
        # workers together see exactly the single-process global batch.
        per_replica = ctx.get_per_replica_batch_size(GLOBAL_BATCH)
        start = ctx.input_pipeline_id * per_replica
        batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
        return batches.map(
            lambda a, b: (a[start : start + per_replica], b[start : start + per_replica])
        )

    iterator = iter(repl.distribute(input_fn))
    step = train_step_fn(repl, model, opt)
    losses = [float(step(iterator)) for _ in range(5)]

    @tf.function
    def ids():
        return repl.run(
            lambda: replication.all_reduce(
                tf.cast(replication.replica_id(), tf.float32) + 1.0, "sum"
            )
        )

    np.savez(
        out,
        losses=np.array(losses),
        id_sum=repl.local_results(ids())[0].numpy(),
        replicas=repl.num_replicas,
        **{f"param{i}": v.numpy() for i, v in enumerate(model.trainable_variables)},
    )
    more = int(os.environ.get("MORE_STEPS", "0"))
    if more:
        repeated = iter(repl.distribute(lambda ctx: input_fn(ctx).repeat()))
        for _ in range(more):
            step(repeated)
            time.sleep(0.25)
        print(f"finished {more} more steps", flush=True)


if __name__ == "__main__":
    main()
