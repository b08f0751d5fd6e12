"""One D4PG learner worker of a two-process group (started by test_learner_workers.py).

Usage: python learner_worker_program.py TASK_INDEX OUT.npz CHECKPOINT_DIR HOST:PORT HOST:PORT

Builds the learner the way the launcher's learner node does
(`launch.runtime.learner_group.make_replicator("cpu", addresses, index)`), feeds worker i
rows [i*b, (i+1)*b) of fixed global batches, and writes the weights after each
update. The chief alone saves a checkpoint between the two updates (a local
operation: a collective inside it would hang the other worker).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from launch.runtime import learner_group


def main() -> None:
    index, out, checkpoint_dir, workers = (
        int(sys.argv[1]),
        sys.argv[2],
        sys.argv[3],
        sys.argv[4:],
    )
    repl = learner_group.make_replicator("cpu", workers, index)
    import numpy as np

    from tests.launch.learner_equivalence import build_learner, weights

    learner = build_learner(repl, checkpoint_dir if index == 0 else None)
    snapshots = {}
    for step in range(2):
        learner.step()
        snapshots[f"step{step}"] = weights(learner)
        if step == 0 and index == 0:
            learner.save()
    # Many more updates must not pile up OS threads (TF 2.15 spends one sleeping thread per
    # collective when collectives have a timeout; the launcher sets none).
    threads_before = len(os.listdir("/proc/self/task"))
    for _ in range(150):
        learner.step()
    threads_after = len(os.listdir("/proc/self/task"))
    stop = learner_group.GroupStop(repl, every=1)
    agreed = stop.should_stop(index == 1, 0)  # Only worker 1 wants to stop: both must.
    np.savez(
        out,
        replicas=repl.num_replicas,
        agreed=agreed,
        threads=[threads_before, threads_after],
        **{f"{k}_{i}": w for k, ws in snapshots.items() for i, w in enumerate(ws)},
    )


if __name__ == "__main__":
    main()
