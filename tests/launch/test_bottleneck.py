"""The bottleneck report on a real Reverb rate limiter: who waits, and the verdict."""

import threading
import time

import numpy as np
import pytest
import reverb

from launch.reporting import bottleneck

pytestmark = pytest.mark.timeout(120)

TABLE = "replay"


def _server(samples_per_insert=4.0, min_size=10, error_buffer=40.0):
    table = reverb.Table(
        TABLE,
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        max_size=100_000,
        rate_limiter=reverb.rate_limiters.SampleToInsertRatio(
            samples_per_insert=samples_per_insert,
            min_size_to_sample=min_size,
            error_buffer=error_buffer,
        ),
    )
    return reverb.Server([table])


def _info(client):
    return client.server_info()[TABLE]


def _completes_within(fn, seconds):
    done = threading.Event()

    def run():
        try:
            fn()
        except RuntimeError:  # The server stopped under a call still waiting.
            return
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(seconds)


def test_blocked_predicates_match_reverb():
    server = _server()
    try:
        client = reverb.Client(f"localhost:{server.port}")
        state = bottleneck.LimiterState.from_table_info(_info(client))
        assert (state.inserts, state.samples, state.samples_per_insert) == (0, 0, 4.0)
        assert state.samples_blocked and not state.inserts_blocked  # Empty: sampling waits.
        # Insert until the limiter says the next insert waits; Reverb must agree.
        inserted = 0
        while not bottleneck.LimiterState.from_table_info(_info(client)).inserts_blocked:
            client.insert(np.float32(inserted), {TABLE: 1.0})
            inserted += 1
            assert inserted < 1000
        state = bottleneck.LimiterState.from_table_info(_info(client))
        assert state.inserts == inserted and not state.samples_blocked
        # Reverb must agree: the next insert waits until exactly k samples were taken,
        # k the smallest number with (diff - k) + samples_per_insert <= max_diff.
        k = int(np.ceil(state.diff + state.samples_per_insert - state.max_diff))
        pending = threading.Event()
        writer = reverb.Client(f"localhost:{server.port}")
        threading.Thread(
            target=lambda: (writer.insert(np.float32(0), {TABLE: 1.0}), pending.set()),
            daemon=True,
        ).start()
        for _ in range(k - 1):
            next(client.sample(TABLE, num_samples=1))
        assert not pending.wait(1.0)
        next(client.sample(TABLE, num_samples=1))
        assert pending.wait(10.0)
        state = bottleneck.LimiterState.from_table_info(_info(client))
        assert (state.inserts, state.samples) == (inserted + 1, k)
        # Sample until the limiter says sampling waits; Reverb must agree.
        while not state.samples_blocked:
            next(client.sample(TABLE, num_samples=1))
            state = bottleneck.LimiterState.from_table_info(_info(client))
        assert not _completes_within(lambda: next(client.sample(TABLE, num_samples=1)), 1.0)
    finally:
        server.stop()


def _run(insert_period, sample_period, seconds=3.0):
    """Inserts and samples at the given periods (0: as fast as the limiter lets them)."""
    server = _server()
    stop = threading.Event()
    address = f"localhost:{server.port}"

    def until_stopped(body):
        # The server stops under a blocked call at the end: its error is expected then.
        def run():
            client = reverb.Client(address)
            try:
                while not stop.is_set():
                    body(client)
            except RuntimeError:
                if not stop.is_set():
                    raise

        return run

    def insert(client):
        client.insert(np.float32(1), {TABLE: 1.0})
        time.sleep(insert_period)

    def sample(client):
        next(client.sample(TABLE, num_samples=1))
        time.sleep(sample_period)

    threads = [threading.Thread(target=until_stopped(f), daemon=True) for f in (insert, sample)]
    for t in threads:
        t.start()
    client = reverb.Client(address)
    monitor = bottleneck.LimiterMonitor(lambda: _info(client), period=0.05).start()
    time.sleep(1.0)
    monitor.report()  # Past the start (the table filling up).
    time.sleep(seconds)
    report = monitor.report()
    monitor.stop()
    stop.set()
    server.stop()  # Unblocks the thread waiting on the limiter.
    return report


def test_slow_sampling_is_learner_bound():
    # 4 samples per insert needed; the "learner" samples 100/s at most: inserts wait.
    report = _run(insert_period=0.0, sample_period=0.01)
    assert report["bottleneck_kind"] == "learner-bound", report
    assert report["actors_blocked"] > 0.5 > report["learner_blocked"]
    advice = "a faster learner (a GPU, more learner workers) or lower samples_per_insert"
    assert advice in report["bottleneck"]
    assert report["replay_samples_per_s"] > 3 * report["replay_inserts_per_s"] > 0


def test_slow_inserting_is_actor_bound():
    # The "actors" insert 50/s at most; the learner could sample far more: sampling waits.
    report = _run(insert_period=0.02, sample_period=0.0)
    assert report["bottleneck_kind"] == "actor-bound", report
    assert report["learner_blocked"] > 0.5 > report["actors_blocked"]
    assert report["bottleneck"].endswith("add actors")


@pytest.mark.parametrize(
    "actors, learner, filling, kind",
    [
        (0.62, 0.05, False, "learner-bound"),
        (0.05, 0.7, False, "actor-bound"),
        (0.1, 0.1, False, "balanced"),
        (0.0, 1.0, True, "filling replay"),
        (None, None, False, "unknown"),
    ],
)
def test_diagnose(actors, learner, filling, kind):
    verdict = bottleneck.diagnose(actors, learner, filling=filling)
    assert verdict.kind == kind
    if kind == "learner-bound":
        assert verdict.message == (
            "learner-bound: actors blocked 62% of the time: a faster learner (a GPU, more "
            "learner workers) or lower samples_per_insert"
        )


def test_counts_are_reported_in_transitions_of_grouped_items():
    """With G transitions per item, inserts and rates count transitions, not items."""
    server = _server(samples_per_insert=1.0, min_size=1, error_buffer=100.0)
    try:
        client = reverb.Client(f"localhost:{server.port}")
        monitor = bottleneck.LimiterMonitor(lambda: _info(client), transitions_per_item=16)
        monitor.poll()
        for _ in range(5):
            client.insert(np.float32(1), {TABLE: 1.0})
        time.sleep(0.1)
        monitor.poll()
        report = monitor.report()
        assert report["replay_inserts"] == 5 * 16
        assert report["replay_inserts_per_s"] == pytest.approx(80 / 0.1, rel=0.8)
    finally:
        server.stop()
