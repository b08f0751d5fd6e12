"""Wiring: replay server, learner, actors and evaluator of D4PG from one config.

`launch/` builds its programs from these functions only; they know nothing of processes.

Example (one process):
  server = make_replay_server(config, env_spec)
  address = f"localhost:{server.port}"
  learner = make_learner(config, env_spec, address, replication.make("cpu"), None)
  actor = make_actor(config, env_spec, address, seed=1)
"""

from __future__ import annotations

import reverb

import replication
from agents import core
from agents.d4pg import networks
from agents.d4pg.acting import BatchedD4PGActor, D4PGActor
from agents.d4pg.adders import NStepTransitionAdder
from agents.d4pg.config import D4PGConfig
from agents.d4pg.group_adder import NStepGroupAdder, TransitionGroupWriter
from agents.d4pg.learning import D4PGLearner, check_grouped_batch, reverb_input_fn
from agents.d4pg.numpy_policy import NumpyPolicy
from agents.d4pg.replay import GroupedRowLayout, make_replay_server
from agents.d4pg.variables import VariableClient

# Steps per Reverb chunk written by actors. Reverb's default chunks hold about n+1 steps,
# so almost every step finalises and compresses chunks; 32-step chunks lowered an actor's
# CPU per step (202 -> 115 us at 16 environments in one noisy run) and left the learner's
# sampling cost per batch unchanged within noise (docs/throughput.md).
ACTOR_CHUNK_LENGTH = 32

__all__ = [
    "make_actor",
    "make_batched_actor",
    "make_environment",
    "make_evaluator",
    "make_learner",
    "make_replay_server",
]


def make_environment(config: D4PGConfig, env_name: str, seed: int):
    """The environment D4PG sees for `config` (features, standardised or not, or pixels).

    Unset `frame_stack` / `action_repeat` take their per-task defaults
    (`D4PGConfig.resolved_frame_stack`, `resolved_action_repeat`).
    """
    import environments  # Imported lazily: it configures MuJoCo's GL backend on import.

    return environments.make(
        env_name,
        seed=seed,
        from_pixels=config.from_pixels,
        height=config.image_size,
        width=config.image_size,
        camera_id=config.camera_id,
        shadows_and_reflections=config.shadows_and_reflections,
        frame_stack=config.resolved_frame_stack(),
        action_repeat=config.resolved_action_repeat(env_name),
        normalize=config.normalize_observations,
    )


def make_learner(
    config: D4PGConfig,
    env_spec,
    replay_address: str,
    replicator: replication.Replicator,
    checkpoint_dir: str | None,
    *,
    rate_limiter_timeout_ms: int = -1,
    publish: bool = True,
    publish_initial: bool = True,
) -> D4PGLearner:
    """A learner sampling from `replay_address` and publishing weights to it.

    Publishes its initial weights immediately, so actors can start acting, unless
    `publish_initial` is False: a caller that will `restore()` (which publishes the
    restored weights) then publishes only if there was nothing to restore, so that
    actors never pull the fresh initialisation in between.
    Call `restore()` to resume from `checkpoint_dir` (it republishes the weights).
    With `rate_limiter_timeout_ms >= 0`, `step()` raises `ReplayTimeoutError` when no batch
    could be sampled for that long (default: wait forever). With `publish=False` the
    learner samples but never writes weights (one of several learners sharing one
    update, where a single one publishes).
    """
    check_grouped_batch(
        replicator.per_replica_batch_size(config.batch_size), config.resolved_transitions_per_item()
    )
    learner = D4PGLearner(
        config,
        env_spec,
        replicator,
        input_fn=reverb_input_fn(replay_address, config, rate_limiter_timeout_ms, env_spec),
        replay_client=reverb.Client(replay_address) if publish else None,
        checkpoint_dir=checkpoint_dir,
    )
    if publish and publish_initial:
        learner.publish_variables()
    return learner


def _make_policy(config: D4PGConfig, env_spec) -> NumpyPolicy:
    act = env_spec.actions
    return NumpyPolicy(
        config,
        pixels=networks.is_pixels(env_spec.observations),
        action_low=act.minimum,
        action_high=act.maximum,
    )


def _make_adders(
    config: D4PGConfig, env_spec, client: reverb.Client, count: int, seed: int
) -> list[core.Adder]:
    """`count` adders (one per environment) of the config's replay layout.

    One transition per item: an `NStepTransitionAdder` (own trajectory writer) each.
    G > 1: `NStepGroupAdder`s sharing one `TransitionGroupWriter`, so an item can hold
    transitions of all the actor's environments.
    """
    short = config.short_transitions_from_first_state
    if config.resolved_transitions_per_item() == 1:
        return [
            NStepTransitionAdder(
                client,
                config.n_step,
                action_shape=env_spec.actions.shape,
                chunk_length=ACTOR_CHUNK_LENGTH,
                short_transitions_from_first_state=short,
            )
            for _ in range(count)
        ]
    writer = TransitionGroupWriter(
        client,
        config.resolved_transitions_per_item(),
        GroupedRowLayout.of(env_spec, config),
        pool_size=config.item_pool_size,
        seed=seed,
        items_per_write=config.items_per_write,
    )
    return [NStepGroupAdder(writer, config.n_step, short) for _ in range(count)]


def make_actor(
    config: D4PGConfig,
    env_spec,
    replay_address: str,
    seed: int,
    with_noise: bool = True,
    with_adder: bool = True,
) -> D4PGActor:
    """An actor pulling weights every `variable_update_period` steps from `replay_address`.

    The weights are what the learner publishes, `D4PGLearner.acting_weights()`: the
    target policy with `config.act_with_target_policy` (Acme), else the online one. So
    batched actors and the evaluator act with the same policy.

    Args:
      seed: seed of its exploration noise (give each actor its own).
      with_noise: add N(0, sigma^2) exploration noise (clipped to the action bounds),
        coloured by `noise_beta`.
      with_adder: write n-step transitions into the "replay" table.
    """
    client = reverb.Client(replay_address)
    adder = None
    if with_adder:
        (adder,) = _make_adders(config, env_spec, client, 1, seed)
    return D4PGActor(
        policy=_make_policy(config, env_spec),
        action_spec=env_spec.actions,
        variable_client=VariableClient(client, update_period=config.variable_update_period),
        adder=adder,
        sigma=config.sigma if with_noise else 0.0,
        seed=seed,
        noise_beta=config.noise_beta,
        sigma_schedule=_sigma_schedule(config),
    )


def make_batched_actor(
    config: D4PGConfig, env_spec, replay_address: str, seed: int, num_envs: int
) -> BatchedD4PGActor:
    """An actor for `num_envs` environments: one n-step adder each, one policy call per step.

    Weights are pulled every `variable_update_period` environment steps over all of them.
    """
    client = reverb.Client(replay_address)
    adders = _make_adders(config, env_spec, client, num_envs, seed)
    return BatchedD4PGActor(
        policy=_make_policy(config, env_spec),
        action_spec=env_spec.actions,
        variable_client=VariableClient(client, update_period=1),
        adders=adders,
        num_envs=num_envs,
        sigma=config.sigma,
        seed=seed,
        variable_update_period=config.variable_update_period,
        noise_beta=config.noise_beta,
        sigma_schedule=_sigma_schedule(config),
    )


def _sigma_schedule(config: D4PGConfig):
    """`config.sigma_at` where sigma decays, else None (a constant sigma, no work per pull)."""
    return config.sigma_at if config.sigma_final_scale != 1.0 else None


def make_evaluator(config: D4PGConfig, env_spec, replay_address: str, seed: int = 0) -> D4PGActor:
    """The deterministic policy: no noise, no adder; pulls weights like an actor.

    Call `update(wait=True)` before each evaluation episode to evaluate the latest weights.
    """
    return make_actor(config, env_spec, replay_address, seed, with_noise=False, with_adder=False)
