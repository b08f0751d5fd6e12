"""Class-conditional SN-GAN training: hinge losses, the D and G step functions, generator EMA.

The computation of one replica is written once (`disc_step`, `gen_step`) and handed to a
`replication.Replicator`; switching its spec (cpu, cpu:N, gpu, multiworker) changes nothing else.
N replicas with per-replica batch B make the same update as one replica with batch N*B:

- gradients are mean-all-reduced by the wrapped optimisers, and every loss is a per-replica mean;
- the generator's batch norms use cross-replica statistics;
- the spectral-norm power-iteration vectors are identical on all replicas;
- latents and fake labels are drawn for the *global* batch from a stateless seed (config seed,
  generator step, D/G sub-step), and each replica takes its slice, so the noise does not depend
  on the replica count.

Losses (hinge, Lim & Ye 2017; Miyato et al. 2018), with `D` the projection discriminator:

    L_D = E_x[max(0, 1 - D(x, y))] + E_z[max(0, 1 + D(G(z, y'), y'))]
    L_G = -E_z[D(G(z, y'), y')]

One training step = `disc_steps` discriminator updates (each on a fresh real batch) followed by
one generator update. Both Adam learning rates decay linearly to zero over the run
(`lr_decay="linear"`): lr(t) = lr * (1 - t / total_steps) at generator step t.
After each generator update the EMA generator follows

    w_ema <- decay * w_ema + (1 - decay) * w    (w_ema <- w before `ema_start` steps)

and it is the EMA generator that is sampled and evaluated, with its batch-norm statistics
recomputed for the averaged weights first ("standing statistics", Brock et al. 2019): the
moving statistics accumulated during training belong to the raw generator's weights, not to
their average.

Defaults follow Miyato et al. 2018 ("Spectral Normalization for GANs", ResNet setting) and
Miyato & Koyama 2018 ("cGANs with Projection Discriminator", ImageNet): n_dis = 5
discriminator updates per generator update, Adam with lr 2e-4, beta1 0, beta2 0.9, and the
learning rate decayed linearly to 0. The EMA generator is BigGAN's (Brock et al. 2019).
"""

import contextlib
import dataclasses
from collections.abc import Iterator

import sonnet as snt
import tensorflow as tf

import replication
from vision.common.normalization import BatchNorm
from vision.sngan import networks as sngan

LR_DECAYS = ("linear", "constant")


@dataclasses.dataclass
class SNGANConfig:
    """Model and optimisation hyperparameters (the data decides `num_classes`/`channels`)."""

    num_classes: int = 10
    image_size: int = 32
    channels: int = 3
    latent_dim: int = 128
    g_base_channels: int = 64
    d_base_channels: int = 64
    global_batch_size: int = 64
    disc_steps: int = 5  # n_dis
    g_learning_rate: float = 2e-4
    d_learning_rate: float = 2e-4
    beta1: float = 0.0
    beta2: float = 0.9
    adam_epsilon: float = 1e-8
    lr_decay: str = "linear"  # to 0 over `total_steps`, or "constant"
    total_steps: int = 100_000  # generator steps the linear decay spans (the run's --steps)
    standing_samples: int = 1024  # latents the EMA generator's batch-norm statistics use
    ema_decay: float = 0.999
    ema_start: int = 1000
    bn_decay: float = 0.999
    seed: int = 0

    def validate(self) -> None:
        """Raises ValueError with what to change if the configuration cannot run."""
        sngan.check_image_size(self.image_size)
        for name in (
            "num_classes",
            "channels",
            "latent_dim",
            "g_base_channels",
            "d_base_channels",
            "global_batch_size",
            "disc_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.lr_decay not in LR_DECAYS:
            raise ValueError(f"lr_decay must be one of {LR_DECAYS}, got {self.lr_decay!r}")
        if self.total_steps < 1 or self.standing_samples < 1:
            raise ValueError("total_steps and standing_samples must be >= 1")


def discriminator_hinge_loss(real_logits: tf.Tensor, fake_logits: tf.Tensor) -> tf.Tensor:
    """`mean(relu(1 - D(real))) + mean(relu(1 + D(fake)))`."""
    return tf.reduce_mean(tf.nn.relu(1.0 - real_logits)) + tf.reduce_mean(
        tf.nn.relu(1.0 + fake_logits)
    )


def generator_hinge_loss(fake_logits: tf.Tensor) -> tf.Tensor:
    """`-mean(D(fake))`."""
    return -tf.reduce_mean(fake_logits)


def update_ema(ema_module: snt.Module, module: snt.Module, decay: tf.Tensor) -> None:
    """`ema <- decay * ema + (1 - decay) * value` for every float variable of `module`
    (weights and batch-norm statistics alike); other variables (counters) are copied."""
    pairs = list(zip(ema_module.variables, module.variables))
    for ema_var, var in pairs:
        if ema_var.shape != var.shape:
            raise ValueError(
                f"EMA variable {ema_var.name} {ema_var.shape} does not match {var.name} {var.shape}"
            )
        if var.dtype.is_floating:
            d = tf.cast(decay, var.dtype)
            ema_var.assign(d * ema_var + (1.0 - d) * var)
        else:
            ema_var.assign(var)


class SNGANLearner(snt.Module):
    """Owns the networks, optimisers, EMA generator and step counter; runs the replicated steps.

    Everything a restart needs is an attribute, so `tf.train.Checkpoint(learner=learner)`
    saves and restores it exactly.

    Example:
        >>> repl = replication.make("cpu:2")
        >>> learner = SNGANLearner(SNGANConfig(image_size=16, channels=1), repl)
        >>> data = repl.distribute(input_fn)   # per-replica batches {"image", "label"}
        >>> metrics = learner.train_step(iter(data))
    """

    def __init__(self, config: SNGANConfig, replicator, name: str = "sngan"):
        super().__init__(name=name)
        config.validate()
        self.config = config
        self._repl = replicator
        self.per_replica_batch_size = replicator.per_replica_batch_size(config.global_batch_size)
        c = config
        with replicator.scope():

            def generator(name):
                return sngan.Generator(
                    c.num_classes,
                    c.image_size,
                    c.channels,
                    c.g_base_channels,
                    c.latent_dim,
                    c.bn_decay,
                    name=name,
                )

            self.generator = generator("generator")
            self.generator_ema = generator("generator_ema")
            self.discriminator = sngan.Discriminator(c.num_classes, c.image_size, c.d_base_channels)

            # The current learning rates: set from the schedule at every update.
            self.g_learning_rate = tf.Variable(c.g_learning_rate, trainable=False, name="g_lr")
            self.d_learning_rate = tf.Variable(c.d_learning_rate, trainable=False, name="d_lr")

            def adam(learning_rate):
                return replicator.wrap_optimizer(
                    snt.optimizers.Adam(
                        learning_rate, beta1=c.beta1, beta2=c.beta2, epsilon=c.adam_epsilon
                    )
                )

            self.g_optimizer = adam(self.g_learning_rate)
            self.d_optimizer = adam(self.d_learning_rate)
            # Number of generator updates done; also indexes the noise seeds.
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self._build()
        # No data-dependent Python control flow in the steps: skip AutoGraph's conversion cost.
        self._disc_fn = tf.function(self._disc_step_impl, autograph=False)
        self._gen_fn = tf.function(self._gen_step_impl, autograph=False)
        self._generate = tf.function(self._generate_impl, autograph=False)
        self._standing_fn = tf.function(self._standing_impl, autograph=False)

    # ------------------------------------------------------------------ per-replica computation

    def _decay_factor(self) -> tf.Tensor:
        """lr(t) / lr: 1 - t / total_steps ("linear", floored at 0) or 1 ("constant")."""
        if self.config.lr_decay == "constant":
            return tf.constant(1.0)
        progress = tf.cast(self.step, tf.float32) / float(self.config.total_steps)
        return tf.maximum(0.0, 1.0 - progress)

    def _noise(self, local_batch: int, sub_step) -> tuple[tf.Tensor, tf.Tensor]:
        """This replica's slice of the global batch of latents and fake labels."""
        c = self.config
        n = replication.num_replicas()
        counter = tf.cast(self.step, tf.int64) * (c.disc_steps + 1) + tf.cast(sub_step, tf.int64)
        z_seed = tf.stack([tf.constant(c.seed, tf.int64), 2 * counter])
        y_seed = tf.stack([tf.constant(c.seed, tf.int64), 2 * counter + 1])
        z = tf.random.stateless_normal([local_batch * n, c.latent_dim], z_seed)
        y = tf.random.stateless_uniform(
            [local_batch * n], y_seed, maxval=c.num_classes, dtype=tf.int32
        )
        start = tf.cast(replication.replica_id(), tf.int32) * local_batch
        return z[start : start + local_batch], y[start : start + local_batch]

    def disc_step(self, batch: dict[str, tf.Tensor], sub_step: tf.Tensor) -> dict[str, tf.Tensor]:
        """One discriminator update on this replica's real `batch` {"image", "label"}."""
        images, labels = batch["image"], tf.cast(batch["label"], tf.int32)
        local_batch = self.per_replica_batch_size
        z, fake_labels = self._noise(local_batch, sub_step)
        fakes = self.generator(z, fake_labels, is_training=True)
        d_vars = self.discriminator.trainable_variables
        self.d_learning_rate.assign(self.config.d_learning_rate * self._decay_factor())
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(d_vars)
            # One call on real+fake advances the spectral-norm power iteration once per step.
            logits = self.discriminator(
                tf.concat([images, fakes], 0), tf.concat([labels, fake_labels], 0), is_training=True
            )
            real_logits, fake_logits = logits[:local_batch], logits[local_batch:]
            loss = discriminator_hinge_loss(real_logits, fake_logits)
        self.d_optimizer.apply(tape.gradient(loss, d_vars), d_vars)
        return {
            "d_loss": loss,
            "d_real": tf.reduce_mean(real_logits),
            "d_fake": tf.reduce_mean(fake_logits),
        }

    def gen_step(self) -> dict[str, tf.Tensor]:
        """One generator update, then the EMA update."""
        c = self.config
        z, labels = self._noise(self.per_replica_batch_size, c.disc_steps)
        g_vars = self.generator.trainable_variables
        self.g_learning_rate.assign(self.config.g_learning_rate * self._decay_factor())
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(g_vars)
            fakes = self.generator(z, labels, is_training=True)
            loss = generator_hinge_loss(self.discriminator(fakes, labels, is_training=False))
        self.g_optimizer.apply(tape.gradient(loss, g_vars), g_vars)
        decay = tf.where(self.step + 1 > c.ema_start, c.ema_decay, 0.0)
        update_ema(self.generator_ema, self.generator, decay)
        return {"g_loss": loss}

    # ------------------------------------------------------------------ cross-replica driving

    def _build(self) -> None:
        """Creates every variable (so a checkpoint can be restored before the first step) and
        starts the EMA generator equal to the generator."""
        c = self.config
        b = 2

        def build():
            z = tf.zeros([b, c.latent_dim])
            y = tf.zeros([b], tf.int32)
            self.generator(z, y, is_training=False)
            self.generator_ema(z, y, is_training=False)
            self.discriminator(
                tf.zeros([b, c.image_size, c.image_size, c.channels]), y, is_training=False
            )
            update_ema(self.generator_ema, self.generator, tf.constant(0.0))
            return tf.constant(0)

        # Eagerly, once: creating variables while tracing a replicated step is fragile on
        # TF 2.15 (see replication/variables.py). Silence the "eager run is slow" warning.
        logger = tf.get_logger()
        level = logger.level
        logger.setLevel("ERROR")
        try:
            self._repl.run(build)
        finally:
            logger.setLevel(level)
        # Optimiser slots too. Otherwise they are created on the first update, inside the
        # step: a checkpoint restored before then defers them (warning that it found no
        # matching objects), and each step function is traced twice.
        for optimizer, module in (
            (self.g_optimizer, self.generator),
            (self.d_optimizer, self.discriminator),
        ):
            optimizer.create_state(module.trainable_variables)

    def _disc_step_impl(self, iterator: Iterator, sub_step: tf.Tensor) -> dict[str, tf.Tensor]:
        metrics = self._repl.run(self.disc_step, next(iterator), sub_step)
        return self._repl.reduce(metrics, "mean")

    def _gen_step_impl(self) -> dict[str, tf.Tensor]:
        metrics = self._repl.run(self.gen_step)
        self.step.assign_add(1)
        return self._repl.reduce(metrics, "mean")

    def train_step(self, iterator: Iterator) -> dict[str, tf.Tensor]:
        """Runs `disc_steps` D updates (one distributed batch each) and one G update.

        The D and G updates are separate tf.functions, each traced once whatever `disc_steps`.

        Args:
            iterator: iterator over `repl.distribute(...)` with per-replica batches of
                `per_replica_batch_size` {"image": [B, S, S, C] in [-1, 1], "label": [B]}.

        Returns:
            Scalars averaged over replicas: d_loss, d_real, d_fake (means over the D updates),
            g_loss.
        """
        d_metrics = [
            self._disc_fn(iterator, tf.constant(k, tf.int64)) for k in range(self.config.disc_steps)
        ]
        metrics = {
            key: tf.add_n([m[key] for m in d_metrics]) / len(d_metrics) for key in d_metrics[0]
        }
        metrics.update(self._gen_fn())
        return metrics

    # ------------------------------------------------------------------ standing statistics

    def _ema_statistics(self) -> list[tf.Variable]:
        """The EMA generator's batch-norm moving-average state (counters, hidden, averages)."""
        return [
            v
            for m in self.generator_ema.submodules
            if isinstance(m, BatchNorm)
            for v in m.moving_mean.variables + m.moving_variance.variables
        ]

    def _standing_replica(self, seed: tf.Tensor) -> tf.Tensor:
        c = self.config
        n = replication.num_replicas()
        local = -(-c.standing_samples // n)  # ceil: every replica the same share
        z = tf.random.stateless_normal([local * n, c.latent_dim], tf.stack([seed, -1]))
        y = tf.random.stateless_uniform(
            [local * n], tf.stack([seed, -2]), maxval=c.num_classes, dtype=tf.int32
        )
        start = tf.cast(replication.replica_id(), tf.int32) * local
        for module in self.generator_ema.submodules:
            if isinstance(module, BatchNorm):
                module.reset_moving_statistics()
        # One update of freshly reset (debiased) averages stores exactly the moments of
        # this global batch of `standing_samples` latents, taken under the EMA weights.
        self.generator_ema(z[start : start + local], y[start : start + local], is_training=True)
        return tf.constant(0)

    def _standing_impl(self, seed: tf.Tensor) -> tf.Tensor:
        return self._repl.run(self._standing_replica, seed)

    @contextlib.contextmanager
    def standing_statistics(self, seed: int = 0):
        """Within this context the EMA generator normalises with standing statistics.

        The EMA generator's batch-norm statistics are recomputed for its averaged weights
        from `config.standing_samples` latents (and random labels); on exit the statistics
        the EMA keeps averaging during training are put back, so sampling or evaluating
        changes nothing in the training state (a resumed run stays exact).

        Every worker of a multi-worker run must enter it together (it runs a replicated
        step); inside, sampling is local.
        """
        state = self._ema_statistics()
        saved = [v.numpy() for v in state]
        self._standing_fn(tf.constant(seed, tf.int64))
        try:
            yield
        finally:
            for variable, value in zip(state, saved):
                variable.assign(value)

    def _generate_impl(self, z, labels, use_ema):
        generator = self.generator_ema if use_ema else self.generator
        return generator(z, labels, is_training=False)

    def generate(self, z: tf.Tensor, labels: tf.Tensor, use_ema: bool = True) -> tf.Tensor:
        """Images `[N, S, S, C]` in [-1, 1] from latents and labels (moving BN statistics).

        Call outside `repl.scope()`; the variables are read on this host."""
        return self._generate(
            tf.convert_to_tensor(z, tf.float32), tf.convert_to_tensor(labels, tf.int32), use_ema
        )

    def sample(self, labels, seed: int = 0, use_ema: bool = True) -> tf.Tensor:
        """Images for `labels` with latents from a fixed `seed`."""
        labels = tf.convert_to_tensor(labels, tf.int32)
        z = tf.random.stateless_normal([tf.shape(labels)[0], self.config.latent_dim], [seed, 0])
        return self.generate(z, labels, use_ema)
