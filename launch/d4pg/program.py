"""The distributed D4PG program: one replay node, one learner, N actors, one evaluator.

    replay     Reverb server ("replay" + "params" tables); publishes its address;
               checkpoints the tables every `replay_checkpoint_every_s` and on stop;
               restarted on failure: it restores its last checkpoint and rebinds the
               port it had, and its clients reconnect (docs/fault-tolerance.md).
    learner    `replication.make(learner_replicas)`; restores, updates, publishes
               weights every `publish_period` updates, checkpoints; restarted on failure
               (it resumes from its last checkpoint).
    learner_k  with `learner_workers` K > 1: workers 1..K-1 of one multi-worker learner
               (node group "learner", `launch.runtime.learner_group`); "learner" is worker 0,
               the chief, the only one that publishes, checkpoints and writes summaries.
               A failed worker restarts the whole group from the chief's checkpoint.
    actor_i    noisy episodes -> n-step transitions; restarted on failure.
    evaluator  noise-free episodes every `eval_every_steps` actor steps (or `eval_every_s`
               seconds); restarted on failure.

Shutdown order: learner and evaluator first (the learner saves while actors still
feed it, so it is not stuck behind the rate limiter), then the actors (stateless:
killed after 3 s if blocked in an insert), then the replay server, which saves last.

Everything is plain data (`launch.runtime.program`), so the same program runs on the
threads, local and Ray backends.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from launch.d4pg.nodes import REPLAY_STOP_TIMEOUT_S
from launch.runtime.program import Node, Program, Ref, Resources, RestartPolicy

if TYPE_CHECKING:
    from agents.d4pg.config import D4PGConfig

_NODES = "launch.d4pg.nodes"

# Config keys that may change when a run is resumed (they do not shape checkpoints).
# Left out on purpose although they do not shape checkpoints either: the Acme options
# `act_with_target_policy`, `short_transitions_from_first_state` (and `network_init`,
# moot after step 0), whose effect is measured per run; one that switched halfway would
# measure neither value (docs/d4pg.md, "Differences from Acme").
RESUMABLE_CONFIG_KEYS = frozenset(
    {
        "sigma",
        "variable_update_period",
        "publish_period",
        "prefetch_size",
        "max_in_flight_samples_per_worker",
        "seed",
        "jit_compile",
        "updates_per_call",
        "fuse_updates_per_call",
        "items_per_write",
    }
)


# Base hyperparameters a new run starts from (then --config.KEY=VALUE applies on top).
# "paper" is D4PGConfig's defaults, the published agent. "quick" shrinks networks and
# batch so that a 2-core laptop shows learning within minutes. Its replay ratio and
# learning rates were chosen by benchmarks/agents_quick_preset_sweep.py (actor steps to
# eval return 800 on cartpole:swingup, 3 seeds per candidate): Adam 1e-3 with 32 samples
# per insert reached 800 at 40k-60k actor steps on 3 of 3 seeds; the former 3e-4 with 16
# took 133k-200k+ and missed on one seed; 1e-3 with 16 also missed on one.
# At Adam 1e-3 a policy can saturate for good (a README run acted one constant action for
# 100k steps: pre-tanh ~50, policy_grad_norm 0; 3 of 14 runs missed 800). A pre-activation
# penalty pulls such a policy back. Its weight was chosen on the whole learning suite
# (benchmarks/results/agents_learning_suite*.json; docs/d4pg.md): with 1e-4 every suite
# task is at or above D4PG's published mean at 100k and 200k actor steps (without the
# penalty ball_in_cup:catch is below), and 1e-3 trailed 1e-4 on finger:spin and
# walker:walk. On cartpole:swingup 1e-3 reached 800 sooner (8 of 8 seeds, median 46k
# actor steps, against 7 of 8 and 63k with 1e-4, seeds 0-2 reaching it with both).
# 16 updates per call (the config's default is 8): with the K updates as one XLA
# computation, the README command's learner ran 1.18x the updates/s of K=8
# (benchmarks/results/launch_setting_ab_k16.json; the maths per update is the same).
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {},
    "quick": {
        "policy_layers": (64, 64),
        "critic_layers": (128, 128),
        "batch_size": 64,
        "min_replay_size": 1000,
        "samples_per_insert": 32.0,
        "variable_update_period": 250,
        "publish_period": 10,
        "updates_per_call": 16,
        "policy_lr": 1e-3,
        "critic_lr": 1e-3,
        "policy_preactivation_penalty": 1e-4,
        # Both rates fall linearly to a tenth over the run's own budget (see
        # LR_DECAY_OVER_BUDGET_PRESETS): on the six suite tasks at 200k this kept every run
        # from collapsing and passed the constant rates on walker, reacher and cheetah,
        # while finger:spin learned slower (docs/d4pg.md, "A decaying learning rate").
        "lr_final_scale": 0.1,
        # ...but only from half of the budget on: held at 1e-3 until then, the means at 200k
        # rose on cheetah:run, finger:spin, walker:walk and ball_in_cup:catch (finger:spin
        # past D4PG's reference), over 12 seeds on reacher:easy too, with one evaluation dip
        # in 42 runs (docs/d4pg.md, "A decay that starts at half the run").
        "lr_decay_start_fraction": 0.5,
    },
}
# Values a preset adds for one task, on feature observations (pixels keep the preset):
# chosen on the learning suite at equal actor steps, where the preset trails the
# references by most. finger:spin, the suite's hardest exploration task for it: a 256-256
# critic and 64 samples per insert (one learner update per actor step) raised the mean
# eval return over twelve seeds from 494 to 685 at 100k actor steps and from 681 to 786
# at 200k, nine seeds higher and no collapse (benchmarks/results/
# agents_learning_suite_finger_critic256_spi64.json; docs/d4pg.md, "Per-task values").
# It costs ~2.6x the wall time per actor step: the learner makes twice the updates, each
# on a wider critic. Over 500k actor steps the lead is smaller (six seeds: 817 against the
# preset's 772, both under D4PG's 834). --config.KEY=VALUE still overrides either value.
PRESET_TASK_VALUES: dict[str, dict[str, dict[str, Any]]] = {
    "quick": {
        "finger:spin": {"critic_layers": (256, 256), "samples_per_insert": 64.0},
    },
}


def preset_task_values(preset: str, task: str, from_pixels: bool) -> dict[str, Any]:
    """What `preset` adds for `task` (empty for most tasks, and always for pixels)."""
    if from_pixels:
        return {}
    return dict(PRESET_TASK_VALUES.get(preset, {}).get(task, {}))


# Presets whose learning rates decay over the run's budget: a new run without
# --config.lr_decay_updates gets the learner updates its --steps bring
# (`updates_in_budget`), stored with the run. A fixed span fitted one budget only: decaying
# over 100k updates helped the suite's 200k-step runs, but 500k-step runs then spent 300k
# steps at a tenth of the rate and ended lower on cheetah:run, finger:spin and walker:walk
# than with constant rates; spanning the 500k (250k updates) ended higher on cheetah:run.
LR_DECAY_OVER_BUDGET_PRESETS = frozenset({"quick"})


def updates_in_budget(config: D4PGConfig, actor_steps: int) -> int:
    """Learner updates a run of `actor_steps` makes: the rate limiter holds the learner to
    `samples_per_insert` sampled transitions per inserted one, `batch_size` per update."""
    return max(1, round(actor_steps * config.samples_per_insert / config.batch_size))


# Default actor-step budget of `replicator launch d4pg`. With the quick preset, the
# README command reaches eval return 800 at 46k-87k actor steps (see
# benchmarks/results/launch_time_to_score*.json); 100k leaves a margin on most launches
# (one of 21 measured on 2026-12-04/05 missed: docs/d4pg.md; one of 6 later that day,
# at 794: docs/throughput.md; a 150k budget, alternated
# with it seed by seed, reached 800 no sooner) and ends in about 100 s on 2 cores.
QUICK_STEPS = 100_000


@dataclasses.dataclass(frozen=True)
class D4PGProgramSettings:
    """How the program is laid out (not part of a run's identity: may change on resume).

    Attributes:
      task: dm-control task, e.g. "cartpole:swingup".
      num_actors: Number of actor nodes.
      envs_per_actor: Environments each actor process steps (one batched policy call).
      learner_replicas: `replication` spec of the learner, e.g. "cpu:2" or "gpu".
      replay_port: Port of the replay server (0: any free port).
      learner_checkpoint_every_steps: Learner checkpoint period in updates... The
        former 1,000 meant a save every ~1.3 s of a quick-preset learner running 750
        updates/s: ~5% of its main thread where two launches share the cores (a save took
        126 ms there), not measurable on a quiet machine (docs/throughput.md). 10,000 is
        every ~13 s at that speed; the seconds bound applies to slower learners.
      learner_checkpoint_every_s: ...or in seconds, whichever comes first.
      learner_snapshot_every_s: A learner checkpoint at least this many seconds after
        the last policy snapshot also writes one (and the last checkpoint always does).
      replay_checkpoint_every_s: Replay checkpoint period: what a replay crash may lose
        (see docs/fault-tolerance.md for its cost).
      eval_every_s: Seconds between evaluations (each of `eval_episodes` episodes), used
        when `eval_every_steps` is None.
      eval_every_steps: Actor steps between evaluations (None: schedule by seconds).
      keep_snapshots: Policy snapshots (RUN/snapshots/step_N) the learner keeps.
      eval_episodes: Episodes per evaluation.
      report_every_s: Period of learner/replay metrics and TensorBoard summaries.
      learner_workers: Learner processes forming one multi-worker learner (1: one).
      learner_gpus: GPUs each learner worker asks its backend for (0 for cpu specs).
      learner_intra_op_threads: Threads one TensorFlow op of a learner process may use,
        XLA's compiled update included (0: TensorFlow's default, one per core). None: 1
        for a learner of one CPU replica in one process on feature observations, else 0.
        That learner's whole update is one XLA computation which splits two of its loops
        in halves over 2 threads and waits for the second half; where actors and the
        evaluator share the cores, that wait cost the README command's learner 5-10% of
        its updates (docs/throughput.md); on one thread the update computes the same
        values.
      ray_resources: Extra Ray custom resources per role ("replay", "learner",
        "actor", "evaluator"), e.g. ``{"learner": {"learner_host": 1}}`` (each
        learner worker asks for them); ignored by the local and threads backends.
      learner_stall_timeout_s: A worker of a multi-worker learner that completes no
        update for this long is stuck (e.g. in an all-reduce whose peer hangs: TF 2.15
        collectives have no timeout) and the group restarts from the last checkpoint
        (`Node.stall_timeout`; 0: never). One learner process is never timed.
      max_restarts: Restart budget of every node: more failures than this...
      restart_window_s: ...within this many seconds stop the run.
    """

    task: str = "cartpole:swingup"
    num_actors: int = 2
    envs_per_actor: int = 1
    learner_replicas: str = "cpu"
    replay_port: int = 0
    learner_checkpoint_every_steps: int = 10_000
    learner_checkpoint_every_s: float = 120.0
    learner_snapshot_every_s: float = 60.0
    replay_checkpoint_every_s: float = 120.0
    eval_every_s: float = 20.0
    eval_every_steps: int | None = None
    eval_episodes: int = 3
    keep_snapshots: int = 3
    report_every_s: float = 5.0
    learner_workers: int = 1
    learner_gpus: float = 0.0
    learner_intra_op_threads: int | None = None
    ray_resources: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    learner_stall_timeout_s: float = 300.0
    max_restarts: int = 10
    restart_window_s: float = 600.0

    def learner_replica_count(self) -> int:
        """Replicas of the whole learner (`learner_replica_count`)."""
        return learner_replica_count(self.learner_replicas, self.learner_workers, self.learner_gpus)

    def resolved_learner_intra_op_threads(self, from_pixels: bool) -> int:
        """`learner_intra_op_threads`, its default resolved (0: TensorFlow's own)."""
        if self.learner_intra_op_threads is not None:
            return self.learner_intra_op_threads
        one_cpu = _cpu_counts(self.learner_replicas) == (1, 1)  # "cpu" or "cpu:1"
        return 1 if one_cpu and self.learner_workers == 1 and not from_pixels else 0

    def learner_names(self) -> list[str]:
        """Node names of the learner workers, the chief first."""
        return ["learner"] + [f"learner_{i}" for i in range(1, self.learner_workers)]


def learner_replica_count(spec: str, workers: int, gpus_per_worker: float) -> int:
    """Replicas of a learner of `workers` workers: per worker those of a `cpu:N` spec, else
    one per GPU the worker asks for (at least one)."""
    return (replicas_of(spec) or max(1, int(gpus_per_worker))) * workers


def replicas_of(spec: str) -> int | None:
    """Replica count of a `cpu:N[xM]` spec, without importing TensorFlow (None: unknown)."""
    return _cpu_counts(spec)[0]


def _cpu_counts(spec: str) -> tuple[int | None, int]:
    if spec == "cpu":
        return 1, 1
    if spec.startswith("cpu:"):
        head, _, tail = spec[4:].partition("x")
        if head.isdigit() and (not tail or tail.isdigit()):
            return int(head), int(tail or 1)
    return None, 1


def make_program(settings: D4PGProgramSettings, config: dict[str, Any]) -> Program:
    """Builds the D4PG program.

    Args:
      settings: The layout.
      config: ``D4PGConfig.to_dict()`` of the (already validated) config.
    """
    config = _with_pinned_layout(settings, config)
    common = {"task": settings.task, "config": config}
    address = Ref("replay_address")
    budget = {"max_restarts": settings.max_restarts, "restart_window": settings.restart_window_s}
    custom = settings.ray_resources
    group = settings.learner_workers > 1
    learners = [
        Node(
            name,
            f"{_NODES}:learner",
            {
                **common,
                "replay_address": address,
                "replicas": settings.learner_replicas,
                "intra_op_threads": settings.resolved_learner_intra_op_threads(
                    bool(config.get("from_pixels"))
                ),
                "checkpoint_every_steps": settings.learner_checkpoint_every_steps,
                "checkpoint_every_s": settings.learner_checkpoint_every_s,
                "snapshot_every_s": settings.learner_snapshot_every_s,
                "report_every_s": settings.report_every_s,
                "keep_snapshots": settings.keep_snapshots,
                **({"worker_index": index} if group else {}),
            },
            resources=Resources(
                cpus=1.0,
                gpus=settings.learner_gpus,
                custom=dict(custom.get("learner", {})),
                spread=group,
            ),
            restart=RestartPolicy(initial_backoff=2.0, max_backoff=60.0, **budget),
            stop_phase=0,
            stop_timeout=30.0 if index == 0 else 15.0,
            group="learner" if group else "",
            stall_timeout=settings.learner_stall_timeout_s if group else 0.0,
            # Workers other than the chief save nothing (the chief writes the checkpoint):
            # killing one at its stop deadline loses nothing.
            stateless=index > 0,
        )
        for index, name in enumerate(settings.learner_names())
    ]
    nodes = [
        Node(
            "replay",
            f"{_NODES}:replay",
            {
                **common,
                "port": settings.replay_port,
                "checkpoint_every_s": settings.replay_checkpoint_every_s,
                "report_every_s": settings.report_every_s,
            },
            resources=Resources(cpus=0.5, custom=dict(custom.get("replay", {}))),
            restart=RestartPolicy(
                initial_backoff=1.0,
                max_backoff=10.0,
                fatal_hint="Relaunch with the same --run-dir to resume from the last replay "
                "and learner checkpoints.",
                **budget,
            ),
            stop_phase=2,
            stop_timeout=REPLAY_STOP_TIMEOUT_S,
        ),
        *learners,
    ]
    for i in range(settings.num_actors):
        nodes.append(
            Node(
                f"actor_{i}",
                f"{_NODES}:actor",
                {
                    **common,
                    "replay_address": address,
                    "index": i,
                    "envs_per_actor": settings.envs_per_actor,
                },
                resources=Resources(cpus=1.0, custom=dict(custom.get("actor", {})), spread=True),
                restart=RestartPolicy(initial_backoff=1.0, max_backoff=30.0, **budget),
                stop_phase=1,
                stop_timeout=3.0,
                stateless=True,
            )
        )
    nodes.append(
        Node(
            "evaluator",
            f"{_NODES}:evaluator",
            {
                **common,
                "replay_address": address,
                "episodes": settings.eval_episodes,
                "every_s": settings.eval_every_s,
                "every_steps": settings.eval_every_steps,
            },
            resources=Resources(cpus=0.5, custom=dict(custom.get("evaluator", {}))),
            restart=RestartPolicy(initial_backoff=1.0, max_backoff=30.0, **budget),
            stop_phase=0,
            stop_timeout=3.0,
            stateless=True,
        )
    )
    setup = None
    replicas, per_replica = _cpu_counts(settings.learner_replicas)
    count = (replicas or 1) * per_replica
    if count > 1:
        # All nodes in one process (threads backend): carve the logical CPUs first.
        setup = ("replication:ensure_logical_cpus", {"count": count})
    return Program("d4pg", nodes, setup=setup)


def _with_pinned_layout(settings: D4PGProgramSettings, config: dict[str, Any]) -> dict[str, Any]:
    """`config` with its transitions per replay item resolved for the learner's replicas.

    Every node builds its replay table or input pipeline from the one config, so the value
    is fixed here, once, rather than resolved by each node (the CLI pins it before, for
    the run's stored identity; this covers programs built in Python).
    """
    if config.get("transitions_per_item") is not None:
        return config
    from agents.d4pg.config import D4PGConfig  # pylint: disable=import-outside-toplevel

    replicas = settings.learner_replica_count()
    return D4PGConfig.from_dict(config).with_pinned_layout(replicas).to_dict()


def identity(task: str, config: dict[str, Any]) -> dict[str, Any]:
    """What makes two launches the same run (checked when a run dir is reused)."""
    return {"program": "d4pg", "task": task, "config": config}
