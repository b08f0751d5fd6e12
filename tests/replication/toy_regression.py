"""A toy regression shared by the multi-worker and parameter-server tests."""

import numpy as np
import sonnet as snt
import tensorflow as tf

import replication

GLOBAL_BATCH = 8
FEATURES = 3
TRUE_W = np.array([[1.5], [-2.0], [0.5]], np.float32)


def data(steps: int = 5, noise: float = 0.1):
    rng = np.random.RandomState(0)
    x = rng.randn(steps * GLOBAL_BATCH, FEATURES).astype(np.float32)
    y = (x @ TRUE_W + noise * rng.randn(len(x), 1)).astype(np.float32)
    return x, y


def build(repl: replication.Replicator, learning_rate: float = 0.05):
    with repl.scope():
        model = snt.Linear(1, w_init=snt.initializers.Constant(0.1))
        model(tf.zeros([1, FEATURES]))
        opt = repl.wrap_optimizer(snt.optimizers.Adam(learning_rate))
    return model, opt


def loss_fn(model, x, y):
    return tf.reduce_mean((model(x) - y) ** 2)


def train_step_fn(repl, model, opt):
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(model, x, y)
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    @tf.function
    def train(iterator):
        return repl.reduce(repl.run(step, *next(iterator)), "mean")

    return train
