"""`replicator`: launch distributed D4PG, evaluate and plot runs, list tasks, train vision models.

    replicator launch d4pg                       # short distributed run on this machine
    replicator launch d4pg --env walker:walk --actors 8 --steps 2000000 \\
        --learner-replicas cpu:2 --run-dir runs/walker --config.batch_size=256
    replicator evaluate runs/walker --episodes 10 --video walker.mp4
    replicator evaluate runs/walker --all-snapshots --seeds 1 2 3
    replicator export runs/walker --out walker_policy
    replicator plot runs/walker-seed* --metric eval_return
    replicator list-tasks

TensorFlow's, XLA's and Reverb's C++ log lines go to log files, not the console;
`replicator --verbose COMMAND` shows them.

Exit status: 0 finished, 130 interrupted (every node saved), 1 a node failed (at run
time, or to stop cleanly or to save: the message names it and its log), 2 a usage
error (one line saying what to do; nothing in an existing run directory is touched).

One module per command (`launch_d4pg`, `evaluate`, `export`, `plot`, `list_tasks`,
`train`), each with `register(commands)` and `run(args)`; `app` builds the parser.
"""

from launch.cli.app import main

__all__ = ["main"]
