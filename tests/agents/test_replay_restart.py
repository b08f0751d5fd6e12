"""A replay that restarts empty on its port: weight pulls never hang, the learner republishes.

Issue 18, item 0: a replay killed before its first checkpoint comes back with no weights.
Actors sampled the empty "params" table and blocked for ever (Reverb's `sample` has no
deadline), while the learner waited for `min_replay_size` and never published again.
Real Reverb servers, restarted on the same port like the replay node does.
"""

import threading

import numpy as np
import pytest
import reverb

import replication
from agents.d4pg import builder, variables
from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import D4PGLearner, ReplayTimeoutError, StepCancelledError
from agents.d4pg.replay import PARAMS_TABLE, make_replay_server
from tests.agents.test_checkpointing import CONFIG, SPEC, _acting_shapes, _input_fn

pytestmark = pytest.mark.timeout(300)


def _restart_empty(server: reverb.Server) -> reverb.Server:
    port = server.port
    server.stop()
    return make_replay_server(CONFIG, SPEC, port=port)


def _finishes(fn, seconds: float = 60.0):
    """Runs `fn` in a thread; returns its result, or fails if it is still blocked."""
    result, error = [], []

    def run():
        try:
            result.append(fn())
        except Exception as e:  # pylint: disable=broad-except
            error.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds:g}s"
    if error:
        raise error[0]
    return result[0]


def _first_call_after_restart(fn):
    """`fn()`; once more if the first call fails on the connection the restart closed
    (gRPC reports a dead connection once, to the first call on it; after that the channel
    reconnects silently, which is how the actors met the empty table)."""
    try:
        return fn()
    except RuntimeError as e:
        assert "socket closed" in str(e).lower() or "unavailable" in str(e).lower(), e
        return fn()


def test_a_weight_pull_after_an_empty_restart_returns_and_keeps_the_weights():
    server = make_replay_server(CONFIG, SPEC)
    try:
        address = f"localhost:{server.port}"
        weights = [np.full(s, 0.5, np.float32) for s in _acting_shapes(CONFIG)]
        variables.publish(reverb.Client(address), 7, weights)
        pulled = variables.VariableClient(reverb.Client(address), update_period=1)
        assert pulled.update() and pulled.version == 7
        server = _restart_empty(server)
        assert (
            _finishes(lambda: _first_call_after_restart(pulled.update)) is False
        )  # No pull: the table is empty...
        assert pulled.version == 7  # ...and the weights in use stay.
        np.testing.assert_array_equal(pulled.weights[0], weights[0])
        variables.publish(reverb.Client(address), 9, weights)
        assert _finishes(pulled.update) and pulled.version == 9
    finally:
        server.stop()


def test_waiting_for_weights_has_a_deadline():
    server = make_replay_server(CONFIG, SPEC)
    try:
        pulled = variables.VariableClient(
            reverb.Client(f"localhost:{server.port}"), wait_timeout_s=1.0
        )
        with pytest.raises(variables.WeightsUnavailableError, match="is the learner running"):
            _finishes(lambda: pulled.update(wait=True))
    finally:
        server.stop()


def test_the_learner_republishes_to_a_replay_that_came_back_without_weights():
    server = make_replay_server(CONFIG, SPEC)
    try:
        address = f"localhost:{server.port}"
        learner = D4PGLearner(
            CONFIG, SPEC, replication.make("cpu"), _input_fn, replay_client=reverb.Client(address)
        )
        learner.publish_variables()
        learner.step()
        assert learner.republish_if_missing() is False  # The weights are there.
        server = _restart_empty(server)
        assert _first_call_after_restart(learner.republish_if_missing) is True
        sizes = {t: i.current_size for t, i in reverb.Client(address).server_info().items()}
        assert sizes[PARAMS_TABLE] == 1
        pulled = variables.VariableClient(reverb.Client(address))
        assert pulled.update(wait=True) and pulled.version == learner.num_steps > 0
        for a, b in zip(pulled.weights, learner.acting_weights()):
            np.testing.assert_array_equal(a, b)
    finally:
        server.stop()


def test_publishing_to_a_replay_that_went_away_raises_instead_of_hanging():
    # The learner hung at a stop after its launcher's death: the replay stopped first and
    # the learner's next publish waited for ever for its confirmation.
    server = make_replay_server(CONFIG, SPEC)
    weights = [np.zeros(s, np.float32) for s in _acting_shapes(CONFIG)]
    publisher = variables.WeightsPublisher(
        reverb.Client(f"localhost:{server.port}"), timeout_ms=1000
    )
    publisher.publish(1, weights)
    server.stop()
    with pytest.raises(reverb.errors.DeadlineExceededError, match="is the replay down"):
        _finishes(lambda: publisher.publish(2, weights), seconds=30)


def _in_thread(fn) -> tuple[threading.Thread, list[BaseException]]:
    """Starts `fn` in a daemon thread; the list receives what it raises."""
    outcome: list[BaseException] = []

    def run():
        try:
            fn()
        except Exception as e:  # pylint: disable=broad-except
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_step_blocked_on_a_stopped_replay_is_cancelled_and_the_learner_still_saves(tmp_path):
    # Reverb's sampler retries a server that does not answer for ever, so at a stop where
    # the replay went first the learner sat in `step()` until its deadline, unsaved.
    from tests.agents.test_adders import SPEC as ADDER_SPEC  # pylint: disable=import-outside-toplevel
    from tests.agents.test_adders import _write  # pylint: disable=import-outside-toplevel

    config = D4PGConfig.from_overrides(
        {
            **CONFIG.to_dict(),
            "n_step": 1,
            "batch_size": 4,
            "min_replay_size": 1,
            "samples_per_insert": 0,
            "updates_per_call": 1,
            "transitions_per_item": 1,  # `_write` writes items of one transition.
        }
    )
    server = make_replay_server(config, ADDER_SPEC)
    address = f"localhost:{server.port}"
    learner = builder.make_learner(
        config,
        ADDER_SPEC,
        address,
        replication.make("cpu"),
        str(tmp_path / "ckpt"),
        rate_limiter_timeout_ms=1000,
        publish=False,
    )
    with pytest.raises(ReplayTimeoutError):  # An empty table: the sampling timeout...
        learner.step()
    _write(reverb.Client(address), 1, [(20, 1.0)])
    learner.step()  # ...is no cancellation: the next step samples again.
    server.stop()

    def step_for_ever():  # The batches prefetched before the stop come first.
        while True:
            learner.step()

    thread, outcome = _in_thread(step_for_ever)
    thread.join(5.0)
    assert thread.is_alive(), outcome  # Blocked: no timeout fires without an answer.
    steps = learner.num_steps
    learner.cancel_steps()
    thread.join(30.0)
    assert not thread.is_alive(), "the step still waits after cancel_steps()"
    assert isinstance(outcome[0], StepCancelledError), outcome
    assert learner.num_steps == steps
    assert learner.save().endswith(f"ckpt-{steps}")
    with pytest.raises(StepCancelledError):  # Later steps too: the learner is stopping.
        learner.step()


def test_a_first_step_filling_the_row_pool_from_a_stopped_replay_is_cancelled(tmp_path):
    """With `row_mixing="pool"` the first step fills the learner's pool from the input
    before its update; a fill that waits on a replay gone away is cancelled like one."""
    config = D4PGConfig.from_overrides(
        {
            **CONFIG.to_dict(),
            "batch_size": 8,
            "min_replay_size": 1,
            "samples_per_insert": 0,
            "updates_per_call": 2,
            "transitions_per_item": 4,
            "row_mixing": "pool",
            "shuffle_buffer_transitions": 64,
        }
    )
    server = make_replay_server(config, SPEC)
    learner = builder.make_learner(
        config,
        SPEC,
        f"localhost:{server.port}",
        replication.make("cpu"),
        str(tmp_path / "ckpt"),
        publish=False,
    )
    assert learner._row_pool is not None  # pylint: disable=protected-access
    server.stop()
    thread, outcome = _in_thread(learner.step)
    thread.join(5.0)
    assert thread.is_alive(), outcome  # Waiting in the fill.
    learner.cancel_steps()
    thread.join(30.0)
    assert not thread.is_alive(), "the fill still waits after cancel_steps()"
    assert isinstance(outcome[0], StepCancelledError), outcome
    assert learner.num_steps == 0
