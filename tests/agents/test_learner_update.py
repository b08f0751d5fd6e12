"""The D4PG learner's update, checked against an independent reference.

The reference re-implements the networks (pixel torso included) with plain TensorFlow
ops in float64 on copies of the weights (no Sonnet, no learner code), projects the
target with the numpy C51 loops of `test_losses`, takes the policy gradient through
Acme's surrogate loss 0.5 |stop(a + clip(dQ/da)) - a|^2 (a different formula from the
learner's output-gradient form, equal in value), and clips and applies Adam in numpy.
The checked update has target networks unlike the online ones, so a bootstrap target
computed with any online module (torso, policy or critic) fails it.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from dm_env import specs

import replication
from agents.d4pg import networks
from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import D4PGLearner, Transition
from environments import EnvironmentSpec
from tests.agents.test_losses import _reference_projection

pytestmark = pytest.mark.timeout(240)

OBS, ACT, BATCH = 3, 2, 8
SPEC = EnvironmentSpec(
    observations=specs.Array((OBS,), np.float32),
    actions=specs.BoundedArray((ACT,), np.float32, -1.0, 1.0),
    rewards=specs.Array((), np.float32),
    discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
)
BASE = {
    "policy_layers": "8,6",
    "critic_layers": "8,6",
    "num_atoms": 11,
    "vmin": -5.0,
    "vmax": 5.0,
    "batch_size": BATCH,
    "policy_lr": 1e-2,
    "critic_lr": 3e-2,
    "target_update_period": 100,
    "jit_compile": False,
    "updates_per_call": 1,  # One update per step() call: these tests count single updates.
}
LN_EPS = 1e-5
ADAM_EPS = 1e-8
# float32 learner against the float64 reference: measured errors are <= 1.3e-7 relative
# (metrics) and 1e-7 absolute (parameters ~0.6, moments ~1e-2, theirs <= 1e-8).
RTOL, ATOL = 1e-5, 1e-6


def _data(seed=0, rows=BATCH) -> Transition:
    rng = np.random.default_rng(seed)
    return Transition(
        rng.normal(0, 1, (rows, OBS)).astype(np.float32),
        rng.uniform(-1, 1, (rows, ACT)).astype(np.float32),
        rng.normal(0, 3, rows).astype(np.float32),  # Some targets leave [-5, 5].
        rng.choice([0.0, 0.9, 0.95], rows).astype(np.float32),  # Nonzero: Z matters.
        rng.normal(0, 1, (rows, OBS)).astype(np.float32),
    )


def _fixed_input(data: Transition):
    def input_fn(ctx):
        return tf.data.Dataset.from_tensors(data).repeat()

    return input_fn


def _learner(overrides, data, spec=SPEC, repl=None) -> D4PGLearner:
    config = D4PGConfig.from_overrides({**BASE, **overrides})
    return D4PGLearner(config, spec, repl or replication.make("cpu"), _fixed_input(data))


def _random_arrays(variables, seed, scale=0.6):
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, scale, v.shape).astype(np.float32) for v in variables]


def _randomise(variables, seed, scale=0.6):
    for v, value in zip(variables, _random_arrays(variables, seed, scale)):
        v.assign(value)


PIXELS = EnvironmentSpec(
    observations=specs.Array((10, 10, 3), np.uint8),
    actions=specs.BoundedArray((ACT,), np.float32, -1.0, 1.0),
    rewards=specs.Array((), np.float32),
    discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
)
PIXEL_OVERRIDES = {
    "from_pixels": True,
    "conv_channels": "4",
    "conv_kernels": "3",
    "conv_strides": "2",
    "torso_output_size": 6,
    "random_shift_pad": 2,
}


def _pixel_data(seed=0) -> Transition:
    rng = np.random.default_rng(seed)
    base = _data(seed)
    frames = rng.integers(0, 256, (2, BATCH, 10, 10, 3)).astype(np.uint8)
    return Transition(frames[0], base.action, base.reward, base.discount, frames[1])


# ----------------------------------------------------------------- reference maths


def _layer_norm(h, scale, offset):
    mean = tf.reduce_mean(h, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.square(h - mean), axis=-1, keepdims=True)
    return (h - mean) / tf.sqrt(var + LN_EPS) * scale + offset


def _mlp(x, weights, every_layer_norm=False):
    """LayerNormMLP on a list [w0, b0, scale, offset, (w, b)...] of tf tensors, or with
    `every_layer_norm` [w0, b0, scale, offset, (w, b, scale, offset)...]."""
    w0, b0, scale, offset, *rest = weights
    h = tf.tanh(_layer_norm(x @ w0 + b0, scale, offset))
    step = 4 if every_layer_norm else 2
    for i in range(0, len(rest), step):
        h = h @ rest[i] + rest[i + 1]
        if every_layer_norm:
            h = _layer_norm(h, rest[i + 2], rest[i + 3])
        h = tf.nn.elu(h)
    return h


def _torso(obs, t, strides):
    """Features: themselves. Pixels: x/255 -> VALID convs (relu) -> flatten -> Linear ->
    LayerNorm -> tanh, on t = [(conv w, b)..., w, b, scale, offset]."""
    if not t:
        return tf.constant(obs)
    h = tf.constant(obs / 255.0)
    for i, stride in enumerate(strides):
        h = tf.nn.relu(tf.nn.conv2d(h, t[2 * i], stride, "VALID") + t[2 * i + 1])
    h = tf.reshape(h, [h.shape[0], -1])
    w, b, scale, offset = t[-4:]
    return tf.tanh(_layer_norm(h @ w + b, scale, offset))


def _policy(embedding, p):  # Actions in [-1, 1]: the affine rescaling is the identity.
    return tf.tanh(_mlp(embedding, p[:-2]) @ p[-2] + p[-1])


def _critic(embedding, action, c, every_layer_norm=False):
    x = tf.concat([embedding, action], -1)
    return _mlp(x, c[:-2], every_layer_norm) @ c[-2] + c[-1]


def _split(arrays, config):
    """`get_variables(["all"])`: the torso's arrays (none for features), 8 policy, 8 critic
    (10 with the critic's `critic_layer_norm="every"`: its second layer's scale and offset)."""
    n_critic = 10 if config.critic_layer_norm == "every" else 8
    n_torso = len(arrays) - 8 - n_critic
    assert n_torso in (0, 2 * len(config.conv_strides) + 4)
    return arrays[:n_torso], arrays[n_torso : n_torso + 8], arrays[n_torso + 8 :]


def _reference_update(config, online, target, data):
    """Expected metrics, Adam moments (m) and new parameters after one update.

    `online` and `target` are `get_variables(["all"])`-ordered arrays. The optimisers are
    fresh (their first step), and no target copy precedes the update.
    """
    support = np.linspace(config.vmin, config.vmax, config.num_atoms)
    t_on, p_on, c_on = (
        [tf.Variable(a.astype(np.float64)) for a in x] for x in _split(online, config)
    )
    t_tg, p_tg, c_tg = (
        [tf.constant(a.astype(np.float64)) for a in x] for x in _split(target, config)
    )
    obs, act, rew, disc, nxt = (np.asarray(x, np.float64) for x in data)
    strides = config.conv_strides
    every = config.critic_layer_norm == "every"

    # The bootstrap target: TARGET torso, policy and critic at o_{t+m}.
    next_embedding = _torso(nxt, t_tg, strides)
    next_logits = _critic(next_embedding, _policy(next_embedding, p_tg), c_tg, every).numpy()
    next_probs = np.exp(next_logits - next_logits.max(-1, keepdims=True))
    next_probs /= next_probs.sum(-1, keepdims=True)
    atoms = rew[:, None] + disc[:, None] * support[None, :]
    projected = _reference_projection(atoms, next_probs, support)

    with tf.GradientTape() as tape:  # Trains the online torso and critic.
        embedding = _torso(obs, t_on, strides)
        logits = _critic(embedding, act, c_on, every)
        log_probs = logits - tf.reduce_logsumexp(logits, -1, keepdims=True)
        critic_loss = -tf.reduce_mean(tf.reduce_sum(projected * log_probs, -1))
    critic_grads = [g.numpy() for g in tape.gradient(critic_loss, t_on + c_on)]

    embedding = tf.stop_gradient(embedding)
    with tf.GradientTape(persistent=True) as tape:
        actions = _policy(embedding, p_on)
        tape.watch(actions)
        logits = _critic(embedding, actions, c_on, every)
        q = tf.reduce_sum(tf.nn.softmax(logits) * support, -1)
    dqda = tape.gradient(q, actions).numpy()
    norms = np.linalg.norm(dqda, axis=-1)
    clipped = np.where(
        (norms > config.dqda_clipping)[:, None],
        dqda * (config.dqda_clipping / np.maximum(norms, 1e-30))[:, None],
        dqda,
    )
    with tf.GradientTape() as tape:
        preactivation = _mlp(embedding, p_on[:-2]) @ p_on[-2] + p_on[-1]
        actions = tf.tanh(preactivation)
        surrogate = tf.reduce_mean(
            0.5 * tf.reduce_sum(tf.square(tf.stop_gradient(actions + clipped) - actions), -1)
        )
        penalty = config.policy_preactivation_penalty * tf.reduce_sum(preactivation**2) / len(obs)
        surrogate += penalty
    policy_grads = [g.numpy() for g in tape.gradient(surrogate, p_on)]

    def clip(grads):
        norm = np.sqrt(sum(np.sum(g**2) for g in grads))
        scale = min(1.0, config.max_gradient_norm / norm)
        return [g * scale for g in grads], norm

    critic_grads, critic_norm = clip(critic_grads)
    policy_grads, policy_norm = clip(policy_grads)

    def adam(params, grads, lr):  # First step: m_hat = g, v_hat = g^2.
        return [p.numpy() - lr * g / (np.sqrt(g * g) + ADAM_EPS) for p, g in zip(params, grads)]

    next_atoms_outside = (atoms > support[-1]) | (atoms < support[0])
    metrics = {
        "critic_loss": critic_loss.numpy(),
        "policy_loss": -np.mean(q.numpy()),
        "q_mean": np.mean(q.numpy()),
        "critic_grad_norm": critic_norm,
        "policy_grad_norm": policy_norm,
        "dqda_clip_fraction": np.mean(norms > config.dqda_clipping),
        "policy_saturation": np.mean(np.abs(preactivation.numpy()) > 3.0),
        "preactivation_penalty": penalty.numpy(),
        "edge_mass": np.mean(projected[:, 0] + projected[:, -1]),
        "beyond_support_mass": np.mean(np.sum(np.where(next_atoms_outside, next_probs, 0), -1)),
    }
    moments = {"policy": [0.1 * g for g in policy_grads], "critic": [0.1 * g for g in critic_grads]}
    new_critic = adam(t_on + c_on, critic_grads, config.critic_lr)
    n_torso = len(t_on)
    new_params = (
        new_critic[:n_torso] + adam(p_on, policy_grads, config.policy_lr) + new_critic[n_torso:]
    )
    return metrics, moments, new_params, norms


def _moments_in_all_order(learner, group):
    """The Adam first moments of `group`, in `get_variables(["all"])` order (critic: the
    torso's, then the critic's)."""
    nets = learner.networks
    if group == "policy":
        opt, params = learner._policy_optimizer.optimizer, nets.policy_variables()
        ordered = nets.policy.ordered_variables()
    else:
        opt, params = learner._critic_optimizer.optimizer, nets.critic_variables()
        ordered = [v for v in nets.all_variables() if v.ref() in {p.ref() for p in params}]
    by_ref = {p.ref(): m.numpy() for p, m in zip(params, opt.m)}
    return [by_ref[v.ref()] for v in ordered]


CASES = {
    "features": (SPEC, {}, _data),
    "pixels": (PIXELS, {**PIXEL_OVERRIDES, "random_shift": False}, _pixel_data),
}


@pytest.mark.parametrize("penalty", [0.0, 0.05], ids=["dpg", "dpg+penalty"])
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("observations", sorted(CASES))
def test_one_update_matches_the_independent_reference(observations, jit_compile, penalty):
    """An update with online != target networks, as the learner runs it (XLA included),
    with and without the pre-tanh penalty on the policy."""
    _check_one_update_against_reference(
        observations, {"jit_compile": jit_compile, "policy_preactivation_penalty": penalty}
    )


def test_a_critic_normalised_at_every_layer_matches_the_reference():
    """`critic_layer_norm="every"`: each hidden layer of the critic is Linear -> LayerNorm
    -> elu, in the bootstrap target, the critic's loss and the policy's dQ/da (XLA). Data
    seed 1: on seed 0's batch one policy weight's gradient is ~3e-8, within a few times
    Adam's epsilon, where float32 rounding moves its first Adam step by 1e-5 (its moment,
    the gradient itself, matches)."""
    _check_one_update_against_reference(
        "features", {"jit_compile": True, "critic_layer_norm": "every"}, data_seed=1
    )


HOLD = {"lr_decay_start_fraction": 0.5}


@pytest.mark.parametrize(
    "hold, update, scale",
    [({}, 1, 0.8125), ({}, 6, 0.25), (HOLD, 2, 1.0), (HOLD, 3, 0.625)],
    ids=["decaying", "decayed", "held", "decaying-after-hold"],
)
def test_a_decaying_learning_rate_is_the_rate_of_the_reference_update(hold, update, scale):
    """With lr_decay_updates = 4 and lr_final_scale = 0.25, update k applies Adam with both
    rates times 1 - 0.75 min(k / 4, 1): 0.8125 at update 1 and 0.25 from update 4 on.
    With lr_decay_start_fraction = 0.5 the rates are held through update 2 and fall over
    updates 2-4: x1 at update 2, x(1 - 0.75 / 2) = 0.625 at update 3. The exploration sigma
    the learner reports with `sigma_final_scale` 0.5 falls on the same schedule."""
    decay = {"jit_compile": True, "lr_decay_updates": 4, "lr_final_scale": 0.25, **hold}
    decay["sigma_final_scale"] = 0.5  # Reported beside the rates, on their schedule.
    metrics, config = _check_one_update_against_reference(
        "features", decay, num_steps=update, lr_scale=scale
    )
    assert metrics["policy_lr"] == pytest.approx(config.policy_lr * scale, rel=1e-6)
    assert metrics["critic_lr"] == pytest.approx(config.critic_lr * scale, rel=1e-6)
    # The sigma the actors compute for weights of this step (1 - 0.5 progress).
    sigma = config.sigma * (1 - 0.5 * (1 - scale) / 0.75)
    assert config.sigma_at(update) == pytest.approx(sigma, rel=1e-6)
    assert metrics["exploration_sigma"] == pytest.approx(sigma, rel=1e-6)


def test_each_network_decays_to_its_own_final_scale():
    """policy_lr_final_scale = 1 keeps the policy's rate while the critic's follows
    lr_final_scale: at update 2 of 4, policy x1 and critic x(1 - 0.75 / 2) = 0.625."""
    decay = {
        "jit_compile": True,
        "lr_decay_updates": 4,
        "lr_final_scale": 0.25,
        "policy_lr_final_scale": 1.0,
    }
    metrics, config = _check_one_update_against_reference(
        "features", decay, num_steps=2, lr_scale=1.0, critic_lr_scale=0.625
    )
    assert metrics["policy_lr"] == pytest.approx(config.policy_lr, rel=1e-6)
    assert metrics["critic_lr"] == pytest.approx(config.critic_lr * 0.625, rel=1e-6)


def _check_one_update_against_reference(
    observations, overrides, num_steps=1, lr_scale=1.0, critic_lr_scale=None, data_seed=0
):
    """Runs update `num_steps` (not a target copy) of a learner with random online and
    target networks and checks metrics, moments and parameters against the reference,
    whose Adam steps use the config's rates times `lr_scale` (the critic's times
    `critic_lr_scale` when given). Returns (metrics, config)."""
    spec, case_overrides, make_data = CASES[observations]
    overrides = {**case_overrides, **overrides}
    data = make_data(data_seed)
    config = D4PGConfig.from_overrides({**BASE, **overrides})
    shapes = networks.make_networks(config, spec).all_variables()
    online, target = _random_arrays(shapes, seed=1), _random_arrays(shapes, seed=2)
    n_torso = len(_split(online, config)[0])
    # Policy head biases at the edge of saturation: some samples' pre-tanh outputs
    # cross |x| = 3 and some do not, and the penalty's gradient is large there.
    online[n_torso + 7] = np.array([3.0, -3.0], np.float32)
    # Pick dqda_clipping between the smallest and largest per-sample |dQ/da| so that the
    # clip acts on some samples and not others; max_gradient_norm so the critic is clipped.
    _, _, _, norms = _reference_update(config, online, target, data)
    dqda_clip = float(np.median(norms))
    assert norms.min() < dqda_clip < norms.max()

    learner = _learner(
        {**overrides, "dqda_clipping": dqda_clip, "max_gradient_norm": 0.5}, data, spec
    )
    for variables, values in (
        (learner.networks.all_variables(), online),
        (learner.target_networks.all_variables(), target),
    ):
        for var, value in zip(variables, values):
            var.assign(value)
    assert num_steps % config.target_update_period  # No target copy in this update.
    learner._num_steps.assign(num_steps)
    metrics = learner.step()
    reference_config = dataclasses.replace(
        learner._config,
        policy_lr=config.policy_lr * lr_scale,
        critic_lr=config.critic_lr * (lr_scale if critic_lr_scale is None else critic_lr_scale),
        lr_decay_updates=0,
    )
    expected, moments, new_params, _ = _reference_update(reference_config, online, target, data)

    for got, want in zip(learner.get_variables(["target"])[0], target):
        np.testing.assert_array_equal(got, want)  # The targets the reference used.
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=RTOL, abs=ATOL), key
    assert 0 < metrics["dqda_clip_fraction"] < 1
    assert 0 < metrics["policy_saturation"] < 1  # Some saturated outputs, some not.
    assert metrics["critic_clipped"] == 1.0 and expected["critic_grad_norm"] > 0.5
    assert metrics["beyond_support_mass"] > 0 and metrics["edge_mass"] > 0
    for group in ("policy", "critic"):
        for got, want in zip(_moments_in_all_order(learner, group), moments[group]):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * 0.1, err_msg=group)
    for got, want in zip(learner.get_variables(["all"])[0], new_params):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    return metrics, config


def test_target_networks_change_exactly_every_period():
    data = _data(seed=3)
    learner = _learner({"target_update_period": 3}, data)
    _randomise(learner.target_networks.all_variables(), seed=5)  # Differs from online.
    previous_target = learner.get_variables(["target"])[0]
    online_before = learner.get_variables(["all"])[0]
    changed_at = []
    for call in range(1, 8):
        learner.step()
        target = learner.get_variables(["target"])[0]
        if any(not np.array_equal(a, b) for a, b in zip(target, previous_target)):
            changed_at.append(call)
            # The copy is of the online weights as they were before this update.
            for a, b in zip(target, online_before):
                np.testing.assert_array_equal(a, b)
        previous_target = target
        online_before = learner.get_variables(["all"])[0]
    assert changed_at == [1, 4, 7]  # Updates 0, 3, 6 start with a copy.


def test_polyak_targets_move_a_fraction_toward_the_updated_online_weights():
    rate = 0.25
    data = _data(seed=3)
    # The period would copy at updates 0, 3, 6: with a rate it plays no part.
    learner = _learner({"target_update_rate": rate, "target_update_period": 3}, data)
    _randomise(learner.target_networks.all_variables(), seed=5)  # Differs from online.
    target = learner.get_variables(["target"])[0]
    for update in range(5):
        online_before = learner.get_variables(["all"])[0]
        learner.step()
        online_after = learner.get_variables(["all"])[0]
        # Update 0 starts from a copy of the online weights; later ones from the last.
        start = online_before if update == 0 else target
        expected = [t + rate * (o - t) for t, o in zip(start, online_after)]
        target = learner.get_variables(["target"])[0]
        for got, want in zip(target, expected):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert any(not np.allclose(a, b) for a, b in zip(target, online_after))  # A real lag.


def test_the_policy_loss_leaves_critic_and_torso_bit_identical():
    """Two learners differing only in their ONLINE policy make the same critic update.

    Targets are frozen (no copy at update 0: the step counter starts at 1), so the
    online policy reaches nothing but the policy loss. Any leak of that loss into the
    critic or the torso (e.g. a missing stop-gradient) makes the two critics differ.
    """
    data = _pixel_data()
    learners = [_learner(PIXEL_OVERRIDES, data, spec=PIXELS) for _ in range(2)]
    shared = learners[0].get_variables(["all"])[0]
    for i, learner in enumerate(learners):
        for var, value in zip(learner.networks.all_variables(), shared):
            var.assign(value)
        _randomise(learner.target_networks.all_variables(), seed=9)
        _randomise(learner.networks.policy_variables(), seed=20 + i)
        learner._num_steps.assign(1)
    (critic_before,) = learners[0].get_variables(["critic"])
    for learner in learners:
        learner.step()
        learner.step()
    (a_critic,), (b_critic,) = (x.get_variables(["critic"]) for x in learners)
    assert len(a_critic) > 8  # Torso (conv, linear, norm) and critic variables.
    for a, b in zip(a_critic, b_critic):
        np.testing.assert_array_equal(a, b)
    assert all(not np.array_equal(a, c) for a, c in zip(a_critic, critic_before))  # Trained.
    (a_policy,), (b_policy,) = (x.get_variables(["policy"]) for x in learners)
    assert any(not np.array_equal(a, b) for a, b in zip(a_policy, b_policy))


def test_same_seed_same_networks_different_seed_different():
    data = _data()
    first = _learner({"seed": 4}, data).get_variables(["all"])[0]
    again = _learner({"seed": 4}, data).get_variables(["all"])[0]
    other = _learner({"seed": 5}, data).get_variables(["all"])[0]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize(
    "penalty", [0.0, 1e-4, 1e-3], ids=["no-penalty", "quick-preset-penalty", "penalty-1e-3"]
)
def test_the_preactivation_penalty_brings_a_saturated_policy_back(penalty):
    """A policy whose tanh is saturated (pre-tanh ~ +-20: tanh' ~ 1e-17) gets no DPG
    gradient, so Adam never moves it; the penalty's gradient 2cx does, until the
    outputs leave saturation. This is the failure seen in the README's cartpole run."""
    data = _data(seed=4)
    learner = _learner(
        {"policy_preactivation_penalty": penalty, "policy_lr": 0.05, "updates_per_call": 25},
        data,
    )
    nets = learner.networks
    nets.policy.head.b.assign([20.0, -20.0])

    def smallest_preactivation() -> float:
        x = nets.policy.preactivation(nets.torso(tf.constant(data.observation)))
        return float(tf.reduce_min(tf.abs(x)))

    assert smallest_preactivation() > 10
    for _ in range(8):
        metrics = learner.step()
    if penalty:
        assert smallest_preactivation() < 3 and metrics["policy_saturation"] < 1
    else:  # Stuck for good without the penalty.
        assert smallest_preactivation() > 10 and metrics["policy_saturation"] == 1
