"""D4PG maths against hand computations and an independent numpy reference."""

import numpy as np
import pytest
import tensorflow as tf

from agents.d4pg import losses

pytestmark = pytest.mark.timeout(120)


def test_n_step_return_hand_computed():
    gamma = 0.9
    rewards = tf.constant([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [5.0, 0.0, 0.0]])
    discounts = tf.constant([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, -1.0, -1.0]])
    mask = tf.constant([[True] * 3, [True] * 3, [True, False, False]])
    returns, bootstrap = losses.n_step_return(rewards, discounts, gamma, mask=mask)
    # Full window: 1 + .9*2 + .81*3; bootstrap .9^3.
    # Terminal after the 2nd transition: later rewards are cut by the zero discount.
    # Window of length 1 (padding masked): 5, bootstrap .9.
    np.testing.assert_allclose(returns.numpy(), [1 + 1.8 + 2.43, 1 + 1.8, 5.0], rtol=1e-6)
    np.testing.assert_allclose(bootstrap.numpy(), [0.729, 0.0, 0.9], rtol=1e-6)


def _reference_projection(atoms, probs, support):
    """The C51 projection (Bellemare et al. 2017, Alg. 1) with explicit floor/ceil loops."""
    vmin, vmax = support[0], support[-1]
    dz = support[1] - support[0]
    out = np.zeros((atoms.shape[0], support.size), np.float64)
    for b in range(atoms.shape[0]):
        for j in range(atoms.shape[1]):
            tz = min(max(atoms[b, j], vmin), vmax)
            pos = min((tz - vmin) / dz, support.size - 1)  # Guard against rounding past the end.
            lo, hi = int(np.floor(pos)), int(np.ceil(pos))
            if lo == hi:
                out[b, lo] += probs[b, j]
            else:
                out[b, lo] += probs[b, j] * (hi - pos)
                out[b, hi] += probs[b, j] * (pos - lo)
    return out


@pytest.mark.parametrize(
    "num_atoms, vmin, vmax", [(51, -150.0, 150.0), (11, -1.0, 1.0), (5, 0.0, 4.0)]
)
def test_categorical_projection_matches_numpy_reference(num_atoms, vmin, vmax):
    rng = np.random.default_rng(num_atoms)
    support = np.linspace(vmin, vmax, num_atoms).astype(np.float32)
    returns = rng.uniform(vmin, vmax, 16).astype(np.float32)
    discounts = rng.choice([0.0, 0.5, 0.99, 1.0], 16).astype(np.float32)
    atoms = returns[:, None] + discounts[:, None] * support[None, :]
    atoms[0, :] = support  # Exactly on the support.
    atoms[1, :] = vmax + 10.0  # Everything clipped to vmax.
    probs = rng.dirichlet(np.ones(num_atoms), size=16).astype(np.float32)
    projected = losses.categorical_l2_project(atoms, probs, support).numpy()
    expected = _reference_projection(
        atoms.astype(np.float64), probs.astype(np.float64), support.astype(np.float64)
    )
    np.testing.assert_allclose(projected, expected, atol=1e-5)
    np.testing.assert_allclose(projected.sum(axis=1), 1.0, atol=1e-5)


def test_td_loss_is_cross_entropy_to_projected_target():
    support = tf.linspace(-2.0, 2.0, 5)
    logits = tf.constant([[0.1, 0.2, 0.3, 0.2, 0.1]])
    # Target distribution: 0.8 on z = -2 and 0.2 on z = 1 (softmax of these logits).
    target_logits = tf.constant([[np.log(0.8), -50.0, -50.0, np.log(0.2), -50.0]])
    loss = losses.distributional_td_loss(
        logits, tf.constant([1.0]), tf.constant([0.5]), target_logits, support
    )
    # Atoms move to R + D z: -2 -> 0 (all on index 2), 1 -> 1.5 (half on 1.0, half on 2.0).
    log_p = np.log(tf.nn.softmax(logits).numpy()[0])
    expected = -(0.8 * log_p[2] + 0.1 * log_p[3] + 0.1 * log_p[4])
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)
    # With D = 0 the target distribution would play no part: a different loss.
    d0 = losses.distributional_td_loss(
        logits, tf.constant([1.0]), tf.constant([0.0]), target_logits, support
    )
    assert abs(float(d0) - expected) > 1e-2


def test_dpg_loss_gradient_follows_the_critic():
    action = tf.Variable([[0.0]])
    with tf.GradientTape() as tape:
        q = -((action - 0.5) ** 2)  # Best action: 0.5.
        loss = losses.dpg_loss(q[:, 0])
    (grad,) = tape.gradient(loss, [action])
    assert grad.numpy()[0, 0] < 0  # Gradient descent moves the action up, towards 0.5.
