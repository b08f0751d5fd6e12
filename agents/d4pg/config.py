"""D4PG hyperparameters: one typed dataclass, overridable from strings, stored as JSON."""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

# Agent steps per action for pixel runs, by dm-control domain (PlaNet, Hafner et al. 2019,
# whose choices SAC-AE, CURL and DrQ kept): fewer, more consequential decisions per episode
# make pixel learning cheaper; the fast domains keep finer control.
PIXEL_ACTION_REPEAT: dict[str, int] = {"cartpole": 8, "finger": 2, "walker": 2}
DEFAULT_PIXEL_ACTION_REPEAT = 4

# Transitions per replay item for feature runs when `transitions_per_item` is unset.
DEFAULT_TRANSITIONS_PER_ITEM = 16

# Values of `D4PGConfig.network_init`: ours, and Acme's LayerNormMLP (see the docstring).
NETWORK_INITS = ("lecun_uniform", "acme")

# Values of `D4PGConfig.critic_layer_norm`: Acme's first layer only, or every layer.
CRITIC_LAYER_NORMS = ("first", "every")

# Values of `D4PGConfig.row_mixing`: how the learner mixes the rows of sampled items.
ROW_MIXINGS = ("buffer", "block", "pool")

# What a config saved before a key existed meant: the behaviour the runs that wrote it
# had, which need not be today's default (defaults may change when measured). Used by
# `D4PGConfig.from_saved`, e.g. to resume or export such a run.
SAVED_CONFIG_FALLBACKS: dict[str, Any] = {
    "act_with_target_policy": False,
    "network_init": "lecun_uniform",
    "short_transitions_from_first_state": False,
    "transitions_per_item": 1,
    "item_pool_size": 256,  # Unused with one transition per item.
    "shuffle_buffer_transitions": 4096,  # Likewise.
    "row_mixing": "buffer",  # Likewise.
    "lr_decay_updates": 0,  # Constant rates: no run decayed them before the key existed.
    "lr_final_scale": 0.1,  # Unused without a decay.
    "lr_decay_start_fraction": 0.0,  # Decays, where any, started at update 0.
    "policy_lr_final_scale": None,  # Both networks followed lr_final_scale.
    "critic_lr_final_scale": None,
    "normalize_observations": False,
    "target_update_rate": 0.0,  # Hard copies every target_update_period updates.
    "noise_beta": 0.0,  # White exploration noise.
    "sigma_final_scale": 1.0,  # A constant sigma.
    "critic_layer_norm": "first",  # Acme's LayerNormMLP.
}


@dataclasses.dataclass(frozen=True)
class D4PGConfig:
    """Hyperparameters of distributed D4PG (Barth-Maron et al., 2018).

    Every field can be overridden, e.g. from the command line as `--config.batch_size=128`
    via `D4PGConfig.from_overrides({"batch_size": "128"})`. Fields left at None are
    resolved per task (see `value_support`, `resolved_frame_stack`,
    `resolved_action_repeat`, `resolved_random_shift`); explicit values always win.

    Where the defaults come from. "Acme" is acme/agents/tf/d4pg (agent.py,
    agent_distributed.py, learning.py, networks.py), the published implementation by the
    paper's authors, read for this project; "paper" is Barth-Maron et al. 2018.
      From Acme (and consistent with the paper where it states them): discount 0.99,
      n_step 5, batch_size 256, Adam with policy_lr = critic_lr = 1e-4, num_atoms 51,
      sigma 0.3, target_update_period 100 (periodic hard copy), max_replay_size 1e6,
      min_replay_size 1000, samples_per_insert 32 (10% tolerance), variable_update_period
      1000, and with Acme's `clipping=True`: a global-norm clip of 40 per network
      (`max_gradient_norm`) and a per-sample L2-norm clip of dQ/da at 1.0
      (`dqda_clipping`; Acme's `losses.dpg(..., dqda_clipping=1.0, clip_norm=True)`).
      policy_layers (256, 256, 256) and critic_layers (512, 512, 256), each a
      Linear -> LayerNorm -> tanh layer then Linear -> elu layers: the shapes of Acme's
      control-suite example networks (their initialisation is `network_init`).
    Three Acme behaviours are options, off by default: measured on the suite, the first
    two alone and all three together, none was better on every task (docs/d4pg.md):
      act_with_target_policy: Acme's actors and evaluator act with the learner's target
        policy (and target torso); ours act with the online one unless set. Acme value:
        true.
      network_init: Acme initialises every Linear of its LayerNormMLPs (policy and
        critic, the first LayerNorm layer included) with VarianceScaling(0.333,
        "fan_out", "uniform") and the policy head (NearZeroInitializedLinear) with
        VarianceScaling(1e-4, "fan_in", "truncated_normal"); "lecun_uniform"
        (ours) uses VarianceScaling(1.0, "fan_in", "uniform") and a uniform head of the
        same scale. Both: zero biases, LayerNorm scale 1 and offset 0, critic head at
        Sonnet's default (truncated normal, stddev 1/sqrt(fan_in); Acme's
        DiscreteValuedHead passes no initialiser either). Acme value: "acme".
      short_transitions_from_first_state: Acme's NStepTransitionAdder also writes
        o_0 -> o_m for m = 1..n-1 at the start of every episode (n - 1 more items per
        episode of length >= n); ours writes one item per step unless set. Both write
        the short o_t -> o_T items at the episode's end. Acme value: true.
    Where this differs from Acme, whatever the options:
      vmin/vmax: Acme uses a fixed [-150, 150] (right for rewards in [0, 1] per step,
      no action repeat, discount 0.99). Here the default follows the task's reward
      bounds, `action_repeat` and `discount` (`networks.value_support`), so that an
      action repeat of k (per-step rewards up to k) cannot push returns off the support.
      The DPG is taken at o_t through the online torso (stop-gradient); Acme takes it
      at o_{t+m} through the target torso. Both are replay states; ours keeps the
      policy on the embedding the critic is trained on.
      Acme ties both clips to one flag; here `dqda_clipping <= 0` turns the per-sample
      clip off on its own.
      Weights reach actors through the Reverb "params" table, published every
      `publish_period` updates and pulled synchronously every `variable_update_period`
      steps; Acme's actors fetch the learner's current variables in the background on
      the same period. The evaluator runs `eval_*` episodes when due (`launch`), not
      back to back. Policy snapshots hold the policy the actors act with; Acme's
      snapshotter saves the online policy. Before the first update Acme's target
      networks hold their own initialisation; ours start as a copy of the online ones.
      `policy_preactivation_penalty` (0 here, as Acme; the quick preset of
      `replicator launch d4pg` sets 1e-4 against a saturated policy: docs/d4pg.md),
      `normalize_observations` (off here, as Acme has none), `target_update_rate`
      (0 here: Acme's hard copies; Polyak averaging is DDPG's and TD3's), `noise_beta`
      (0 here: Acme's white noise), `sigma_final_scale` (1 here: Acme's constant sigma),
      `critic_layer_norm` ("first" here: Acme's LayerNormMLP; "every" normalises each
      hidden layer of the critic, as critics trained at high replay ratios often are),
      `publish_period`,
      `updates_per_call`, `fuse_updates_per_call`, the conv torso
      (Sonnet's default initialisers under either `network_init`), `random_shift` and the
      pixel defaults are this project's choices (Acme's D4PG has no pixel setup). The
      full list, with what is the same by construction, is in docs/d4pg.md.

    Pixel runs (`from_pixels=True`) default to `frame_stack` 3 (velocities need more
    than one frame), random-shift augmentation (pad 4, random crop; Kostrikov et al.
    2020, DrQ) and the per-domain action repeat of the pixel-control literature
    (PlaNet, Hafner et al. 2019; followed by SAC-AE, CURL and DrQ), `PIXEL_ACTION_REPEAT`:
    cartpole 8, finger 2, walker 2, every other domain 4. Feature runs default to
    frame_stack 1, action_repeat 1 and no augmentation.

    Example:
      >>> cfg = D4PGConfig.from_overrides({"policy_layers": "64,64", "sigma": "0.2"})
      >>> cfg.policy_layers, cfg.sigma
      ((64, 64), 0.2)
    """

    # Return and target.
    discount: float = 0.99
    n_step: int = 5
    # Networks.
    policy_layers: tuple[int, ...] = (256, 256, 256)
    critic_layers: tuple[int, ...] = (512, 512, 256)
    num_atoms: int = 51
    # Support of the categorical critic; None: derived from the task (`value_support`).
    vmin: float | None = None
    vmax: float | None = None
    # Conv torso used when observations are pixels: (channels, kernel, stride) per layer,
    # then a linear layer of `torso_output_size` units.
    conv_channels: tuple[int, ...] = (32, 32, 32)
    conv_kernels: tuple[int, ...] = (3, 3, 3)
    conv_strides: tuple[int, ...] = (2, 1, 1)
    torso_output_size: int = 50
    # Initialisers of the policy and critic MLPs and the policy head: one of
    # `NETWORK_INITS` (see the docstring; "acme" is Acme's LayerNormMLP).
    network_init: str = "lecun_uniform"
    # LayerNorm in the critic's MLP: "first" (Acme's LayerNormMLP: the first layer only)
    # or "every" (each hidden layer's pre-activations too; not Acme's; see the docstring).
    critic_layer_norm: str = "first"
    # Optimisation.
    batch_size: int = 256  # Global batch: split evenly across the learner's replicas.
    policy_lr: float = 1e-4
    critic_lr: float = 1e-4
    clipping: bool = True
    max_gradient_norm: float = 40.0  # Per-network global norm clip when `clipping`.
    dqda_clipping: float = 1.0  # Per-sample L2 norm clip of dQ/da; <= 0: no clip.
    # Adds c * mean_b sum_a x^2 to the policy loss, x the policy head's output before its
    # tanh. Without it a policy can saturate for good: Adam keeps stepping at full size
    # while the gradient through tanh vanishes, |x| grows to ~50, tanh'(x) rounds to 0 and
    # the policy acts one constant action for the rest of the run (seen in the README's
    # cartpole command). The penalty's gradient 2cx pulls such a policy back, and is
    # negligible next to the DPG where |x| is small. 0: off (Acme has none).
    policy_preactivation_penalty: float = 0.0
    # Both Adam rates fall linearly from policy_lr / critic_lr at update 0 to
    # `lr_final_scale` times them at update `lr_decay_updates`, and stay there: early
    # learning keeps its speed while late updates move the weights less. 0: constant
    # rates (Acme). In learner updates: an actor step brings samples_per_insert /
    # batch_size of an update (the quick preset: 32 / 64), so 100000 updates are its 200k
    # actor steps. The quick preset of `replicator launch d4pg` decays to 0.1 over each
    # run's own budget (chosen on the suite: docs/d4pg.md).
    lr_decay_updates: int = 0
    lr_final_scale: float = 0.1
    # The rates are held at policy_lr / critic_lr for this fraction of `lr_decay_updates`
    # and fall linearly over the rest (0: the fall starts at update 0). Holding keeps the
    # early rate through the first phase of learning, where a decay only slows it. The
    # quick preset holds for half its budget (chosen on the suite: docs/d4pg.md).
    lr_decay_start_fraction: float = 0.0
    # One network's own final scale (None: `lr_final_scale`), e.g. a policy kept at its
    # rate (1.0) while the critic's decays. See `final_lr_scales`.
    policy_lr_final_scale: float | None = None
    critic_lr_final_scale: float | None = None
    target_update_period: int = 100
    # Polyak averaging instead of hard copies: after every update the target weights move
    # this fraction of the way to the online ones (target += rate * (online - target),
    # as DDPG and TD3 do; the targets start as a copy). 0: hard copies every
    # `target_update_period` updates (Acme), which the period then sets; > 0 ignores it.
    target_update_rate: float = 0.0
    jit_compile: bool = True  # XLA-compile the forward/backward pass of the update.
    # Image augmentation of the learner's batches (pixels only): pad by
    # `random_shift_pad` pixels (edge replication) and crop back at a random offset.
    # None: on for pixels, off for features.
    random_shift: bool | None = None
    random_shift_pad: int = 4
    # Updates per compiled learner call, each on its own batch (the same maths as one per
    # call; the per-call overhead is paid once). Metrics are the mean over the call.
    updates_per_call: int = 8
    # With one replica, `jit_compile` and feature observations: the K updates of a call as
    # one XLA computation on K batches stacked by the input pipeline (no per-update
    # launch); else (and for pixels) a graph loop of K compiled updates.
    fuse_updates_per_call: bool = True
    # Replay.
    max_replay_size: int = 1_000_000
    min_replay_size: int = 1000
    samples_per_insert: float = 32.0  # <= 0 disables the ratio limiter (MinSize only).
    samples_per_insert_tolerance_rate: float = 0.1
    prefetch_size: int = 4
    max_in_flight_samples_per_worker: int = 512
    # Also write the n-1 transitions o_0 -> o_m (m < n) of each episode, as Acme's adder.
    short_transitions_from_first_state: bool = False
    # Replay layout. 1: one n-step transition per Reverb item, its steps stored once and
    # referenced (`adders.NStepTransitionAdder`). G > 1: each item holds G whole
    # transitions, drawn at random from the actor's last `item_pool_size` ones
    # (`group_adder`), so Reverb's per-item cost is paid once per G transitions on both
    # sides. Every item holds exactly G, so sampling items uniformly samples each
    # transition with the same probability; the learner then mixes the rows of the
    # items it sampled in a shuffle buffer of `shuffle_buffer_transitions` (0: off,
    # batches of B / G whole items), so that a batch holds transitions of many items.
    # Sizes, samples per insert and actor-step counts stay in transitions;
    # `batch_size` must be a multiple of G. Feature observations only (rows are
    # float32; pixels keep 1). None: `DEFAULT_TRANSITIONS_PER_ITEM` (16) for features,
    # as far as each replica's share of the batch allows; 1 for pixels
    # (`resolved_transitions_per_item`). The suite measured 16 against 1 on all six
    # tasks (docs/throughput.md): at or above D4PG's published mean on 5 of 6 against 4,
    # in about half the wall time.
    transitions_per_item: int | None = None
    item_pool_size: int = 256  # Transitions an actor shuffles before it writes G (G > 1).
    # Items (G > 1) an actor holds back and hands to Reverb together, back to back: one
    # item's `Append` and `CreateItem` between environment steps cost ~85 us of CPU (their
    # code and data have left the CPU caches), ~20 us in a run of 16 (docs/throughput.md).
    # The same items in the same order; each reaches the server up to this many items
    # later, so a run may change it when resumed. Measured on the K=16 actor
    # (`agents_actor_profile`).
    items_per_write: int = 16
    shuffle_buffer_transitions: int = 4096  # Learner-side mixing of sampled rows (G > 1).
    # How the learner mixes them (`ROW_MIXINGS`). "buffer": a tf.data shuffle buffer of
    # `shuffle_buffer_transitions` rows, fed row by row (~6 us of learner CPU per
    # transition in per-row dataset ops). "block": the items of one block
    # (`shuffle_buffer_transitions` rows, rounded up to whole batches) are sampled
    # together, their rows permuted in one op and cut into batches: every sampled row is
    # used once, as with the buffer, and a batch of B holds rows of as many items,
    # R/G (1 - (1 - G/R)^B) of a block of R rows (~57 at 4096, 16, 64). Measured: 1.05x the
    # README command's learner updates/s, no gain in learning on the suite (cheetah:run
    # lower on 3 seeds), so not the default (docs/throughput.md). "pool" (the default
    # since 2026-12-05): the buffer's rule inside the learner's compiled update
    # (`row_pool.RowPool`): batches of whole items are swapped row by row into a pool of
    # `shuffle_buffer_transitions` rows (rounded up to whole input elements) at random
    # slots, and the rows they displace are trained on; the buffer's mixing without its
    # per-row dataset ops (README command: ~0.78x the learner's CPU per update, its rate
    # unchanged within the launches' spread; docs/throughput.md). The pool holds the
    # rows as sampled; the update splits them into fields and n-step returns, so the
    # input pipeline only batches K x B / G items per call. One replica only: with
    # several, the rows are mixed as with "buffer".
    row_mixing: str = "pool"
    # Acting.
    sigma: float = 0.3
    # Power-spectrum exponent of the exploration noise (`agents.d4pg.exploration`): 0
    # white, each step drawn independently (Acme); 1 pink, 2 red: correlated over time,
    # a new sequence per episode (Eberhard et al., 2023). Every step is N(0, sigma^2).
    noise_beta: float = 0.0
    # The exploration sigma falls with the learning rates, on their schedule over the
    # learner's updates (held until lr_decay_start_fraction x lr_decay_updates, then linear),
    # to sigma x sigma_final_scale at update lr_decay_updates: late data then lies nearer the
    # deterministic policy that is evaluated. Each actor sets it from the learner step of
    # the weights it pulls. 1.0: constant (Acme). Like lr_final_scale, it acts only with
    # lr_decay_updates > 0 (`replicator launch` refuses it otherwise).
    sigma_final_scale: float = 1.0
    variable_update_period: int = 1000  # Actor pulls weights every K environment steps.
    publish_period: int = 10  # Learner publishes weights every K updates.
    # Actors, evaluator and snapshots use the target policy (and torso), as Acme's do.
    act_with_target_policy: bool = False
    # Environment.
    from_pixels: bool = False
    image_size: int = 84
    camera_id: int = 0  # MuJoCo camera for pixels (-1: the free camera).
    # Off: ~8x cheaper software rendering, <1 intensity level of change on average.
    shadows_and_reflections: bool = False
    frame_stack: int | None = None  # None: 3 for pixels, 1 for features.
    action_repeat: int | None = None  # None: `PIXEL_ACTION_REPEAT` for pixels, 1 for features.
    # Standardise each feature with the task's fixed statistics under random actions
    # (`environments.feature_stats`: mean 0, std 1 there, clipped to +-10), in the
    # environment, so actors, evaluator, replay and snapshots all see standardised
    # features. Features only. Acme's D4PG has none (its first LayerNorm normalises the
    # pre-activations as a whole, not each input).
    normalize_observations: bool = False
    # Reproducibility.
    seed: int = 0

    def __post_init__(self):
        problems = []
        for name in (
            "n_step",
            "num_atoms",
            "batch_size",
            "target_update_period",
            "updates_per_call",
            "max_replay_size",
            "variable_update_period",
            "publish_period",
            "image_size",
            "frame_stack",
            "action_repeat",
            "prefetch_size",
            "max_in_flight_samples_per_worker",
            "torso_output_size",
            "transitions_per_item",
            "item_pool_size",
            "items_per_write",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name} must be >= 1, got {value}")
        if not 0.0 <= self.target_update_rate <= 1.0:
            problems.append(
                "target_update_rate must be in [0, 1] (0: hard copies every "
                f"target_update_period updates), got {self.target_update_rate}"
            )
        if not 0.0 <= self.discount <= 1.0:
            problems.append(f"discount must be in [0, 1], got {self.discount}")
        if (self.vmin is None) != (self.vmax is None):
            problems.append("set both vmin and vmax, or neither (derived from the task)")
        elif self.vmin is not None and self.vmin >= self.vmax:
            problems.append(f"vmin ({self.vmin}) must be < vmax ({self.vmax})")
        if self.num_atoms < 2:
            problems.append(f"num_atoms must be >= 2, got {self.num_atoms}")
        if self.min_replay_size < 1:
            problems.append(f"min_replay_size must be >= 1, got {self.min_replay_size}")
        if self.min_replay_size > self.max_replay_size:
            problems.append("min_replay_size must be <= max_replay_size")
        if self.policy_preactivation_penalty < 0:
            problems.append(
                "policy_preactivation_penalty must be >= 0 (0: off), got "
                f"{self.policy_preactivation_penalty}"
            )
        if self.lr_decay_updates < 0:
            problems.append(f"lr_decay_updates must be >= 0 (0: off), got {self.lr_decay_updates}")
        if not 0.0 <= self.lr_decay_start_fraction < 1.0:
            problems.append(
                f"lr_decay_start_fraction must be in [0, 1), got {self.lr_decay_start_fraction}"
            )
        for key in ("lr_final_scale", "policy_lr_final_scale", "critic_lr_final_scale"):
            value = getattr(self, key)
            if value is not None and not 0.0 <= value <= 1.0:
                problems.append(f"{key} must be in [0, 1], got {value}")
        if self.sigma < 0:
            problems.append(f"sigma must be >= 0, got {self.sigma}")
        if not 0.0 <= self.sigma_final_scale <= 1.0:
            problems.append(f"sigma_final_scale must be in [0, 1], got {self.sigma_final_scale}")
        if not 0.0 <= self.noise_beta <= 2.0:
            problems.append(
                f"noise_beta must be in [0, 2] (0 white, 1 pink, 2 red), got {self.noise_beta}"
            )
        if self.random_shift_pad < 0:
            problems.append(f"random_shift_pad must be >= 0, got {self.random_shift_pad}")
        if self.camera_id < -1:
            problems.append(f"camera_id must be >= -1 (-1: free camera), got {self.camera_id}")
        if self.frame_stack not in (None, 1) and not self.from_pixels:
            problems.append("frame_stack > 1 needs from_pixels=true")
        if self.normalize_observations and self.from_pixels:
            problems.append(
                "normalize_observations standardises features; pixels are scaled by the "
                "network: leave it false with from_pixels=true"
            )
        if self.random_shift and not self.from_pixels:
            problems.append("random_shift applies to pixels: set from_pixels=true")
        if not (len(self.conv_channels) == len(self.conv_kernels) == len(self.conv_strides)):
            problems.append("conv_channels, conv_kernels and conv_strides must have equal lengths")
        if not self.policy_layers or not self.critic_layers:
            problems.append("policy_layers and critic_layers need at least one layer each")
        group = self.resolved_transitions_per_item()
        if group >= 1 and self.batch_size % group:
            problems.append(
                f"batch_size ({self.batch_size}) must be a multiple of transitions_per_item "
                f"({group}): a batch is batch_size / transitions_per_item whole items"
            )
        if self.row_mixing not in ROW_MIXINGS:
            problems.append(
                f"row_mixing must be one of {sorted(ROW_MIXINGS)}, got {self.row_mixing!r}"
            )
        if self.shuffle_buffer_transitions < 0:
            problems.append(
                f"shuffle_buffer_transitions must be >= 0, got {self.shuffle_buffer_transitions}"
            )
        if group > 1 and self.from_pixels:  # Only when set: unset resolves to 1.
            problems.append(
                "transitions_per_item > 1 stores observations inline as float32 feature rows; "
                "pixel runs keep transitions_per_item=1 (each frame stored once)"
            )
        if group > 1 and self.item_pool_size < group:
            problems.append(
                f"item_pool_size ({self.item_pool_size}) must be >= transitions_per_item ({group})"
            )
        if self.critic_layer_norm not in CRITIC_LAYER_NORMS:
            problems.append(
                f"critic_layer_norm must be one of {sorted(CRITIC_LAYER_NORMS)}, "
                f"got {self.critic_layer_norm!r}"
            )
        if self.network_init not in NETWORK_INITS:
            problems.append(
                f"network_init must be one of {sorted(NETWORK_INITS)}, got {self.network_init!r}"
            )
        for name in (
            "act_with_target_policy",
            "short_transitions_from_first_state",
            "normalize_observations",
        ):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name} must be true or false, got {getattr(self, name)!r}")
        if problems:
            raise ValueError("Invalid D4PGConfig: " + "; ".join(problems))

    def final_lr_scales(self) -> tuple[float, float]:
        """(policy, critic): the scale each Adam rate decays to (with `lr_decay_updates`)."""
        return tuple(
            self.lr_final_scale if own is None else own
            for own in (self.policy_lr_final_scale, self.critic_lr_final_scale)
        )

    def decay_window(self) -> tuple[float, float]:
        """(start, end) learner updates of the rates' decay: held until start =
        `lr_decay_start_fraction` x `lr_decay_updates`, linear until end =
        `lr_decay_updates`. Needs a decay (`lr_decay_updates` > 0)."""
        return self.lr_decay_start_fraction * self.lr_decay_updates, float(self.lr_decay_updates)

    def decay_progress(self, update: int) -> float:
        """How far the rates' decay has gone at learner update `update`: 0 until the
        window's start, then linear to 1 at its end (`decay_window`; the learner clips the
        same fraction in its graph). 0 without a decay."""
        if self.lr_decay_updates <= 0:
            return 0.0
        start, end = self.decay_window()
        return min(1.0, max(0.0, (update - start) / (end - start)))

    @staticmethod
    def decayed(value: Any, final_scale: float, progress: Any) -> Any:
        """`value` at `progress` of a linear decay to `final_scale` x `value`: the one rule
        of the rates and the exploration sigma. `value` and `progress` may be floats or
        tensors (the learner's graph): the result has their type."""
        return value * (1.0 - (1.0 - final_scale) * progress)

    def sigma_at(self, update: int) -> float:
        """The exploration sigma of weights from learner update `update`."""
        return self.decayed(self.sigma, self.sigma_final_scale, self.decay_progress(update))

    # -- Per-task defaults -------------------------------------------------------------

    def resolved_frame_stack(self) -> int:
        """`frame_stack`, or 3 for pixels and 1 for features when unset."""
        if self.frame_stack is not None:
            return self.frame_stack
        return 3 if self.from_pixels else 1

    def resolved_action_repeat(self, task: str) -> int:
        """`action_repeat`, or the per-domain pixel default / 1 for features when unset."""
        if self.action_repeat is not None:
            return self.action_repeat
        if not self.from_pixels:
            return 1
        domain = task.split(":")[0]
        return PIXEL_ACTION_REPEAT.get(domain, DEFAULT_PIXEL_ACTION_REPEAT)

    def resolved_transitions_per_item(self, replicas: int = 1) -> int:
        """`transitions_per_item`, or when unset: 1 for pixels, else the largest divisor
        of `DEFAULT_TRANSITIONS_PER_ITEM` that divides each of `replicas` replicas' share
        of the batch (16 for the quick preset's 64 on up to 4 replicas).

        Every node of a run must agree on it (it shapes the replay table), so a launcher
        that knows the learner's replicas pins it once with `with_pinned_layout`; every
        other reader calls this without `replicas`.
        """
        if self.transitions_per_item is not None:
            return self.transitions_per_item
        if self.from_pixels or self.batch_size % replicas:
            return 1
        return math.gcd(DEFAULT_TRANSITIONS_PER_ITEM, self.batch_size // replicas)

    def with_pinned_layout(self, replicas: int = 1) -> D4PGConfig:
        """This config with `transitions_per_item` resolved for `replicas` learner
        replicas and written in, so a stored config means the same after a default
        changes (the replay table's signature depends on it)."""
        return dataclasses.replace(
            self, transitions_per_item=self.resolved_transitions_per_item(replicas)
        )

    def resolved_random_shift(self) -> bool:
        """`random_shift`, or on for pixels and off for features when unset."""
        if self.random_shift is not None:
            return self.random_shift and self.random_shift_pad > 0
        return self.from_pixels and self.random_shift_pad > 0

    # -- Serialisation -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-compatible dict (tuples become lists)."""
        return {
            f.name: (list(v) if isinstance(v, tuple) else v)
            for f in dataclasses.fields(self)
            for v in [getattr(self, f.name)]
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> D4PGConfig:
        """Builds a config from typed values (e.g. `json.loads` of `to_json()`)."""
        _check_known(cls, values)
        hints = typing.get_type_hints(cls)
        return cls(**{k: _coerce(k, v, hints[k]) for k, v in values.items()})

    @classmethod
    def from_saved(cls, values: Mapping[str, Any]) -> D4PGConfig:
        """`from_dict` of a config a run saved, perhaps before some keys existed.

        Keys it lacks that `SAVED_CONFIG_FALLBACKS` names take the behaviour that run had;
        other missing keys take today's defaults.
        """
        return cls.from_dict({**SAVED_CONFIG_FALLBACKS, **values})

    @classmethod
    def from_json(cls, text: str) -> D4PGConfig:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_overrides(
        cls, overrides: Mapping[str, Any], base: D4PGConfig | None = None
    ) -> D4PGConfig:
        """Returns `base` (default: defaults) with `overrides` applied.

        Values may be strings as typed on a command line ("128", "64,64", "true", "1e-4")
        or already-typed values.

        Raises:
          ValueError: naming the unknown key (and listing the valid ones) or the bad value.
        """
        base = base or cls()
        _check_known(cls, overrides)
        hints = typing.get_type_hints(cls)
        parsed = {k: _coerce(k, v, hints[k]) for k, v in overrides.items()}
        return dataclasses.replace(base, **parsed)


def _check_known(cls, values: Mapping[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"Unknown D4PG config key(s) {unknown}. Valid keys: {sorted(known)}")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Converts `value` (string or typed) to the field type `hint`, or raises ValueError."""
    origin = typing.get_origin(hint)
    try:
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "")):
                return None
            return _coerce(key, value, args[0])
        if origin is tuple:
            (elem, *_rest) = typing.get_args(hint)
            if isinstance(value, str):
                items = [s for s in value.replace("(", "").replace(")", "").split(",") if s.strip()]
            else:
                items = list(value)
            return tuple(_coerce(key, item, elem) for item in items)
        if hint is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError(f"expected a boolean (true/false), got {value!r}")
        if hint is int:
            if isinstance(value, bool):
                raise ValueError(f"expected an integer, got {value!r}")
            if isinstance(value, str):
                value = value.strip().replace("_", "")
                try:
                    as_float = float(value)  # Accepts "1e6".
                except ValueError:
                    raise ValueError(f"expected an integer, got {value!r}") from None
                if not as_float.is_integer():
                    raise ValueError(f"expected an integer, got {value!r}")
                return int(as_float)
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"expected an integer, got {value!r}")
            return int(value)
        if hint is float:
            if isinstance(value, bool):
                raise ValueError(f"expected a number, got {value!r}")
            try:
                return float(str(value).strip()) if isinstance(value, str) else float(value)
            except ValueError:
                raise ValueError(f"expected a number, got {value!r}") from None
        if hint is str:
            return str(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"Bad value for D4PG config key {key!r}: {e}") from None
    raise ValueError(f"D4PG config key {key!r} has unsupported type {hint}")
