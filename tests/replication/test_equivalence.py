"""The guarantee: N replicas of batch B update exactly like one replica of batch N*B."""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import replication

PER_REPLICA_BATCH = 4
STEPS = 5
FEATURES = 3


class Net(snt.Module):
    """An MLP with optional cross-replica batch norm and spectral norm."""

    def __init__(self, batch_norm: bool, spectral_norm: bool):
        super().__init__()
        init = snt.initializers.VarianceScaling(seed=1)
        # No bias before batch norm: it has no gradient, and Adam would amplify
        # rounding noise in it into an ill-conditioned comparison.
        self.hidden = snt.Linear(16, with_bias=not batch_norm, w_init=init)
        self.out = snt.Linear(1, w_init=snt.initializers.VarianceScaling(seed=2))
        self.bn = (
            replication.CrossReplicaBatchNorm(True, True, decay_rate=0.9) if batch_norm else None
        )
        # Spectral norm acts on a square 16x16 weight: power iteration needs many
        # steps to converge there, so the persistent u carries real state (on a
        # 16x1 weight one iteration is exact and u could not differ).
        self.mid = snt.Linear(16, w_init=snt.initializers.VarianceScaling(seed=4), name="mid")
        self.sn = replication.SpectralNorm() if spectral_norm else None

    def __call__(self, x, is_training=True):
        h = self.hidden(x)
        if self.bn is not None:
            h = self.bn(h, is_training=is_training)
        h = tf.nn.relu(h)
        if self.sn is not None:
            self.mid(h)  # create w and b
            w = self.sn(self.mid.w, is_training=is_training)
            h = tf.nn.relu(tf.matmul(h, w) + self.mid.b)
        return self.out(h)


def train_without_replicator(global_batch: int):
    """The same training in plain Sonnet and TensorFlow: no strategy, no wrapper."""
    rng = np.random.RandomState(0)
    x = rng.randn(STEPS * global_batch, FEATURES).astype(np.float32)
    y = (x @ rng.randn(FEATURES, 1) + 0.1 * rng.randn(STEPS * global_batch, 1)).astype(np.float32)
    tf.random.set_seed(3)  # as in `train`: the same initial weights
    net = Net(batch_norm=False, spectral_norm=False)
    net(tf.zeros([2, FEATURES]), is_training=False)
    opt = snt.optimizers.Adam(1e-2)
    losses = []
    for i in range(STEPS):
        xb, yb = (
            x[i * global_batch : (i + 1) * global_batch],
            y[i * global_batch : (i + 1) * global_batch],
        )
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((net(xb) - yb) ** 2)
        opt.apply(tape.gradient(loss, net.trainable_variables), net.trainable_variables)
        losses.append(float(loss))
    state = {v.name + str(i): v.numpy() for i, v in enumerate(net.variables)}
    state.update({f"opt{i}": v.numpy() for i, v in enumerate(opt.variables)})
    return losses, state


def train(spec: str, global_batch: int, batch_norm=False, spectral_norm=False):
    repl = replication.make(spec)
    rng = np.random.RandomState(0)
    x = rng.randn(STEPS * global_batch, FEATURES).astype(np.float32)
    y = (x @ rng.randn(FEATURES, 1) + 0.1 * rng.randn(STEPS * global_batch, 1)).astype(np.float32)
    tf.random.set_seed(3)  # same spectral-norm u initialisation in every run
    with repl.scope():
        net = Net(batch_norm, spectral_norm)
        net(tf.zeros([2, FEATURES]), is_training=False)
        opt = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))
    initial_w = net.hidden.w.numpy()

    def input_fn(ctx):
        batch = ctx.get_per_replica_batch_size(global_batch)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)

    def step(features, targets):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((net(features) - targets) ** 2)
        opt.apply(tape.gradient(loss, net.trainable_variables), net.trainable_variables)
        return loss

    @tf.function
    def train_step(iterator):
        return repl.reduce(repl.run(step, *next(iterator)), "mean")

    iterator = iter(repl.distribute(input_fn))
    losses = [float(train_step(iterator)) for _ in range(STEPS)]
    state = {v.name + str(i): v.numpy() for i, v in enumerate(net.variables)}
    state.update({f"opt{i}": v.numpy() for i, v in enumerate(opt.variables)})
    # The parameters moved, so no comparison is one of two initialisations.
    assert np.abs(net.hidden.w.numpy() - initial_w).max() > 1e-3
    return losses, state


def assert_same(reference, candidate):
    ref_losses, ref_state = reference
    losses, state = candidate
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    assert sorted(state) == sorted(ref_state)
    for name, value in ref_state.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


def test_one_replica_matches_plain_sonnet_without_any_replicator():
    # The wrapped optimizer, the strategy and the input split must not change the
    # maths: one replica equals plain Sonnet Adam on the same batches.
    assert_same(
        train_without_replicator(2 * PER_REPLICA_BATCH), train("cpu", 2 * PER_REPLICA_BATCH)
    )


@pytest.mark.parametrize("replicas", [2, 4])
def test_adam_updates_match_single_replica_with_global_batch(replicas):
    reference = train("cpu", PER_REPLICA_BATCH * replicas)
    candidate = train(f"cpu:{replicas}", PER_REPLICA_BATCH * replicas)
    assert_same(reference, candidate)


@pytest.mark.parametrize("replicas", [2, 4])
def test_cross_replica_batch_norm_statistics_match(replicas):
    reference = train("cpu", PER_REPLICA_BATCH * replicas, batch_norm=True)
    candidate = train(f"cpu:{replicas}", PER_REPLICA_BATCH * replicas, batch_norm=True)
    assert_same(reference, candidate)
    means = [v for k, v in candidate[1].items() if "moving_mean" in k]
    assert means and np.abs(means[0]).sum() > 0  # statistics were actually updated


@pytest.mark.parametrize("replicas", [2, 4])
def test_spectral_norm_state_matches_and_normalises(replicas):
    reference = train("cpu", PER_REPLICA_BATCH * replicas, spectral_norm=True)
    candidate = train(f"cpu:{replicas}", PER_REPLICA_BATCH * replicas, spectral_norm=True)
    assert_same(reference, candidate)
    state = candidate[1]
    w = next(v for k, v in state.items() if "mid/w" in k)
    u = next(v for k, v in state.items() if "/u:" in k)
    sigma = float(next(v for k, v in state.items() if "sigma" in k))
    assert w.shape == (16, 16) and u.shape == (1, 16)
    top = np.linalg.svd(w, compute_uv=False)[0]
    # Not converged after STEPS single iterations: u is real state that the
    # replicas had to keep identical (a rank-1 weight would converge at once).
    assert abs(sigma - top) > 0.01 * top
    # sigma is the estimate v W u^T of the last iteration, which never exceeds the
    # top singular value, and u is a unit vector.
    assert sigma < top and abs(np.linalg.norm(u) - 1.0) < 1e-5


def test_each_replica_keeps_an_identical_copy_of_every_variable():
    repl = replication.make("cpu:2")
    with repl.scope():
        net = Net(batch_norm=True, spectral_norm=True)
        net(tf.zeros([2, FEATURES]), is_training=False)
        opt = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(net(x) ** 2)
        opt.apply(tape.gradient(loss, net.trainable_variables), net.trainable_variables)

    data = repl.distribute_dataset(
        tf.data.Dataset.from_tensor_slices(
            np.random.RandomState(1).randn(16, FEATURES).astype(np.float32)
        ).batch(8)
    )
    for batch in data:
        tf.function(lambda b: repl.run(step, b))(batch)
    for variable in net.variables + opt.variables:
        copies = [v.numpy() for v in repl.local_results(variable)]
        assert len(copies) == 2
        np.testing.assert_array_equal(copies[0], copies[1], err_msg=variable.name)


def test_wrapping_twice_is_refused():
    repl = replication.make("cpu")
    with repl.scope():
        opt = repl.wrap_optimizer(snt.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="already wrapped"):
        repl.wrap_optimizer(opt)


def test_optimizer_state_created_outside_scope_is_still_replicated():
    repl = replication.make("cpu:2")
    with repl.scope():
        net = snt.Linear(3)
        net(tf.zeros([1, FEATURES]))
        opt = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))
    opt.create_state(net.trainable_variables)  # e.g. before restoring a checkpoint
    for slot in opt.optimizer.m + opt.optimizer.v:
        assert len(repl.local_results(slot)) == 2, slot.name


def test_asynchronous_optimizer_still_averages_over_replicas_that_step_together():
    # On `ps` a worker with several GPUs runs several replicas in sync; the
    # asynchronous wrapper must average over them (it skips only the wait for other
    # workers). Two logical CPUs stand in for one worker's two GPUs here.
    repl = replication.make("cpu:2")
    with repl.scope():
        net = snt.Linear(1, with_bias=False, w_init=snt.initializers.Zeros())
        net(tf.zeros([1, FEATURES]))
        opt = replication.ReplicatedOptimizer(
            snt.optimizers.SGD(1.0), repl.scope, synchronous=False
        )
    x = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], np.float32)

    def step(xb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(net(xb))  # gradient wrt w is xb^T: differs per replica
        opt.apply(tape.gradient(loss, net.trainable_variables), net.trainable_variables)

    batch = next(iter(repl.distribute_dataset(tf.data.Dataset.from_tensor_slices(x).batch(2))))
    tf.function(lambda b: repl.run(step, b))(batch)
    copies = [v.numpy().ravel() for v in repl.local_results(net.w)]
    np.testing.assert_allclose(copies[0], [-0.5, -1.0, 0.0])
    np.testing.assert_array_equal(copies[0], copies[1])
