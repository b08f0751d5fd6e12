"""D4PG networks (Sonnet): observation torso, deterministic policy, distributional critic.

Three modules, shared by the learner (TensorFlow) and mirrored in numpy for acting
(`agents/d4pg/numpy_policy.py` consumes `acting_variables()` in exactly this order):

  * `Torso`: identity for feature vectors; for uint8 pixels, x/255 -> VALID convs (relu)
    -> flatten -> Linear -> LayerNorm -> tanh (a small embedding, so the critic's first
    layer does not see ~40k inputs).
  * `Policy`: LayerNormMLP (Linear -> LayerNorm -> tanh, then Linear -> elu layers) ->
    near-zero-initialised Linear -> tanh, rescaled to the action bounds.
  * `Critic`: [embedding, action] -> LayerNormMLP -> Linear to `num_atoms` logits of a
    categorical distribution over the fixed support `linspace(vmin, vmax, num_atoms)`,
    (vmin, vmax) from `value_support` (the config's, or derived from the task).

The torso is trained by the critic loss only; the policy sees a stop-gradient embedding.

Initialisation (`config.network_init`, `initializers`): "lecun_uniform" or Acme's "acme"
for the MLPs and the policy head; the critic head and the pixel torso keep Sonnet's
defaults under both (the critic head as in Acme; Acme has no pixel torso).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np
import sonnet as snt
import tensorflow as tf

from agents.d4pg.config import D4PGConfig


@dataclasses.dataclass(frozen=True)
class Initializers:
    """Weight initialisers of one `network_init` (biases are zero in every layer)."""

    mlp: snt.initializers.Initializer  # Every Linear of the policy and critic MLPs.
    policy_head: snt.initializers.Initializer  # Near zero: early actions are the noise.


def initializers(config: D4PGConfig) -> Initializers:
    """The initialisers `config.network_init` names.

    "lecun_uniform": U(+-sqrt(3 / fan_in)) for the MLPs, and a policy head of
    VarianceScaling(1e-4, "fan_in", "uniform").
    "acme": as Acme's `LayerNormMLP` (acme/tf/networks/continuous.py), U(+-sqrt(3 * 0.333 /
    fan_out)) for every Linear of the MLPs, the first (LayerNorm) layer included, and as
    its `NearZeroInitializedLinear`, VarianceScaling(1e-4), i.e. fan_in, truncated normal.
    """
    if config.network_init == "acme":
        return Initializers(
            mlp=snt.initializers.VarianceScaling(0.333, "fan_out", "uniform"),
            policy_head=snt.initializers.VarianceScaling(1e-4, "fan_in", "truncated_normal"),
        )
    return Initializers(
        mlp=snt.initializers.VarianceScaling(1.0, "fan_in", "uniform"),
        policy_head=snt.initializers.VarianceScaling(1e-4, "fan_in", "uniform"),
    )


class LayerNormMLP(snt.Module):
    """Linear -> LayerNorm -> tanh, then (Linear -> elu) for each further layer size.

    The first-layer normalisation keeps the scale of the input (any observation) from
    dictating the scale of everything after it. This is Acme's `LayerNormMLP` with
    `activate_final=True`, as its D4PG networks use it. With `every_layer_norm` each
    further layer is Linear -> LayerNorm -> elu as well (not Acme's; the critic's
    `critic_layer_norm="every"`).

    Args:
      layer_sizes: output size of each Linear.
      w_init: initialiser of every Linear's weights (biases start at zero).
      every_layer_norm: also normalise every further layer's pre-activations.
      name: module name.
    """

    def __init__(
        self,
        layer_sizes: Sequence[int],
        w_init: snt.initializers.Initializer,
        every_layer_norm: bool = False,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.first = snt.Linear(layer_sizes[0], w_init=w_init, name="linear_0")
        self.norm = snt.LayerNorm(axis=-1, create_scale=True, create_offset=True, name="norm")
        self.rest = [
            snt.Linear(size, w_init=w_init, name=f"linear_{i + 1}")
            for i, size in enumerate(layer_sizes[1:])
        ]
        self.rest_norms = [
            snt.LayerNorm(axis=-1, create_scale=True, create_offset=True, name=f"norm_{i + 1}")
            for i in range(len(self.rest) if every_layer_norm else 0)
        ]

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        h = tf.tanh(self.norm(self.first(x)))
        for i, layer in enumerate(self.rest):
            h = layer(h)
            if self.rest_norms:
                h = self.rest_norms[i](h)
            h = tf.nn.elu(h)
        return h

    def ordered_variables(self) -> list[tf.Variable]:
        out = [self.first.w, self.first.b, self.norm.scale, self.norm.offset]
        for i, layer in enumerate(self.rest):
            out += [layer.w, layer.b]
            if self.rest_norms:
                out += [self.rest_norms[i].scale, self.rest_norms[i].offset]
        return out


@snt.allow_empty_variables  # The feature torso has no variables.
class Torso(snt.Module):
    """Observation embedding: identity (flattened float32) for features, a conv net for pixels."""

    def __init__(self, config: D4PGConfig, pixels: bool, name: str | None = "torso"):
        super().__init__(name=name)
        self.pixels = pixels
        if pixels:
            self.convs = [
                snt.Conv2D(c, k, stride=s, padding="VALID", name=f"conv_{i}")
                for i, (c, k, s) in enumerate(
                    zip(config.conv_channels, config.conv_kernels, config.conv_strides)
                )
            ]
            self.linear = snt.Linear(config.torso_output_size, name="embed")
            self.norm = snt.LayerNorm(axis=-1, create_scale=True, create_offset=True, name="norm")
        else:
            self.convs = []

    def __call__(self, observation: tf.Tensor) -> tf.Tensor:
        if not self.pixels:
            x = tf.cast(observation, tf.float32)
            return tf.reshape(x, [tf.shape(x)[0], -1])
        h = tf.cast(observation, tf.float32) / 255.0
        for conv in self.convs:
            h = tf.nn.relu(conv(h))
        h = tf.reshape(h, [tf.shape(h)[0], -1])
        return tf.tanh(self.norm(self.linear(h)))

    def ordered_variables(self) -> list[tf.Variable]:
        if not self.pixels:
            return []
        out = []
        for conv in self.convs:
            out += [conv.w, conv.b]
        return out + [self.linear.w, self.linear.b, self.norm.scale, self.norm.offset]


class Policy(snt.Module):
    """Deterministic policy: embedding -> action within [low, high]."""

    def __init__(
        self,
        config: D4PGConfig,
        action_low: np.ndarray,
        action_high: np.ndarray,
        name: str | None = "policy",
    ):
        super().__init__(name=name)
        self._low = np.asarray(action_low, np.float32)
        self._high = np.asarray(action_high, np.float32)
        inits = initializers(config)
        self.mlp = LayerNormMLP(config.policy_layers, w_init=inits.mlp, name="mlp")
        # Near-zero initial actions: early exploration is the Gaussian noise around 0.
        self.head = snt.Linear(int(self._low.size), w_init=inits.policy_head, name="head")

    def __call__(self, embedding: tf.Tensor) -> tf.Tensor:
        return self.squash(self.preactivation(embedding))

    def preactivation(self, embedding: tf.Tensor) -> tf.Tensor:
        """The head's output before tanh: the learner penalises and monitors it, since
        where |x| is large tanh'(x) ~ 0 and the policy gradient cannot move the action."""
        return self.head(self.mlp(embedding))

    def squash(self, preactivation: tf.Tensor) -> tf.Tensor:
        """tanh, rescaled from [-1, 1] to the action bounds."""
        a = tf.tanh(preactivation)
        return self._low + (a + 1.0) * 0.5 * (self._high - self._low)

    def ordered_variables(self) -> list[tf.Variable]:
        return self.mlp.ordered_variables() + [self.head.w, self.head.b]


# Acme's fixed support, used when neither the config nor the reward spec bounds returns.
FALLBACK_SUPPORT = (-150.0, 150.0)
# Room left on each side of the return bounds, as a fraction of their span: values at the
# bound sit inside the support, so mass on the edge atoms means the support is too small.
SUPPORT_MARGIN = 0.1


def value_support(config: D4PGConfig, env_spec=None) -> tuple[float, float]:
    """(vmin, vmax) of the critic's support: the config's, else derived from the task.

    The rule: with per-agent-step rewards in [r_lo, r_hi] (the environment's reward
    spec; dm-control: [0, 1] per raw step, so [0, action_repeat] per agent step) and
    discount gamma < 1, every discounted return lies in

        [min(r_lo, 0) / (1 - gamma),  max(r_hi, 0) / (1 - gamma)]

    (0 included because an episode may end at once). The n-step target
    R_t + gamma^m z with R_t <= r_hi (1 - gamma^m) / (1 - gamma) and z in that interval
    stays in it for any m, so n-step returns need no extra room. The support is this
    interval widened by `SUPPORT_MARGIN` of its span on each side, e.g. [-10, 110] for
    dm-control with gamma 0.99 and no action repeat, [-80, 880] with action repeat 8.

    Explicit `config.vmin`/`config.vmax` win. Without reward bounds in the spec (or
    without a spec) the support is Acme's fixed [-150, 150].

    Raises:
      ValueError: discount 1 with derived bounds (returns are then unbounded).
    """
    if config.vmin is not None and config.vmax is not None:
        return float(config.vmin), float(config.vmax)
    rewards = getattr(env_spec, "rewards", None)
    low, high = getattr(rewards, "minimum", None), getattr(rewards, "maximum", None)
    if low is None or high is None or not (np.isfinite(low) and np.isfinite(high)):
        return FALLBACK_SUPPORT
    if config.discount >= 1.0:
        raise ValueError(
            "discount=1 gives no finite bound on returns, so the critic's support cannot "
            "be derived: set vmin and vmax (e.g. --config.vmin=0 --config.vmax=1000)."
        )
    horizon = 1.0 / (1.0 - config.discount)
    lo, hi = min(float(low), 0.0) * horizon, max(float(high), 0.0) * horizon
    margin = SUPPORT_MARGIN * max(hi - lo, 1e-6)
    return lo - margin, hi + margin


class Critic(snt.Module):
    """Distributional critic: logits over the atoms `support` for Z(s, a).

    Args:
      config: layer sizes, atom count (and vmin/vmax when `support` is None).
      support: (vmin, vmax); None takes `value_support(config)` (the config's values
        or the fallback). `make_networks` passes the task-derived support.
    """

    def __init__(
        self,
        config: D4PGConfig,
        name: str | None = "critic",
        support: tuple[float, float] | None = None,
    ):
        super().__init__(name=name)
        vmin, vmax = support if support is not None else value_support(config)
        self.support = tf.linspace(float(vmin), float(vmax), config.num_atoms)
        self.mlp = LayerNormMLP(
            config.critic_layers,
            w_init=initializers(config).mlp,
            every_layer_norm=config.critic_layer_norm == "every",
            name="mlp",
        )
        # Sonnet's default initialiser, as Acme's DiscreteValuedHead (it passes none).
        self.head = snt.Linear(config.num_atoms, name="head")

    def __call__(self, embedding: tf.Tensor, action: tf.Tensor) -> tf.Tensor:
        x = tf.concat([embedding, tf.cast(action, tf.float32)], axis=-1)
        return self.head(self.mlp(x))

    def mean(self, logits: tf.Tensor) -> tf.Tensor:
        """Expected value of the categorical distribution given by `logits`."""
        return tf.reduce_sum(tf.nn.softmax(logits) * self.support, axis=-1)


@dataclasses.dataclass
class D4PGNetworks:
    """The three modules of one D4PG network set (online or target)."""

    torso: Torso
    policy: Policy
    critic: Critic

    def policy_variables(self) -> list[tf.Variable]:
        return list(self.policy.trainable_variables)

    def critic_variables(self) -> list[tf.Variable]:
        return list(self.torso.trainable_variables) + list(self.critic.trainable_variables)

    def all_variables(self) -> list[tf.Variable]:
        return (
            self.torso.ordered_variables()
            + self.policy.ordered_variables()
            + (self.critic.mlp.ordered_variables() + [self.critic.head.w, self.critic.head.b])
        )

    def acting_variables(self) -> list[tf.Variable]:
        """Variables an actor needs, in the order `NumpyPolicy.set_weights` expects."""
        return self.torso.ordered_variables() + self.policy.ordered_variables()


def is_pixels(observation_spec) -> bool:
    """True for uint8 HxWxC observations (the conv torso), False for feature vectors."""
    return len(observation_spec.shape) == 3 and np.dtype(observation_spec.dtype) == np.uint8


def make_networks(config: D4PGConfig, env_spec, name_prefix: str = "") -> D4PGNetworks:
    """Builds a network set for `env_spec` and creates its variables (dummy forward pass).

    Call inside `repl.scope()` for replicated variables.
    """
    obs_spec, act_spec = env_spec.observations, env_spec.actions
    pixels = is_pixels(obs_spec)
    nets = D4PGNetworks(
        torso=Torso(config, pixels, name=f"{name_prefix}torso"),
        policy=Policy(
            config,
            act_spec.minimum * np.ones(act_spec.shape),
            act_spec.maximum * np.ones(act_spec.shape),
            name=f"{name_prefix}policy",
        ),
        critic=Critic(config, name=f"{name_prefix}critic", support=value_support(config, env_spec)),
    )
    dummy_obs = tf.zeros((1,) + tuple(obs_spec.shape), tf.dtypes.as_dtype(obs_spec.dtype))
    dummy_act = tf.zeros((1,) + tuple(act_spec.shape), tf.float32)
    embedding = nets.torso(dummy_obs)
    nets.policy(embedding)
    nets.critic(embedding, dummy_act)
    return nets


def acting_variable_shapes(config: D4PGConfig, env_spec) -> list[tuple[int, ...]]:
    """Shapes of `acting_variables()`, computed without building (or initialising) TF.

    Used for the "params" table signature in a process that may not have chosen its
    devices yet (logical CPUs must be configured before TensorFlow initialises).
    """
    obs_shape, act_shape = tuple(env_spec.observations.shape), tuple(env_spec.actions.shape)
    shapes: list[tuple[int, ...]] = []
    if is_pixels(env_spec.observations):
        height, width, channels = obs_shape
        for c, k, s in zip(config.conv_channels, config.conv_kernels, config.conv_strides):
            shapes += [(k, k, channels, c), (c,)]
            height, width, channels = (height - k) // s + 1, (width - k) // s + 1, c
        flat = height * width * channels
        out = config.torso_output_size
        shapes += [(flat, out), (out,), (out,), (out,)]
        embed_size = out
    else:
        embed_size = int(np.prod(obs_shape))
    sizes = list(config.policy_layers)
    shapes += [(embed_size, sizes[0]), (sizes[0],), (sizes[0],), (sizes[0],)]
    for fan_in, fan_out in itertools.pairwise(sizes):
        shapes += [(fan_in, fan_out), (fan_out,)]
    num_actions = int(np.prod(act_shape))
    return shapes + [(sizes[-1], num_actions), (num_actions,)]
