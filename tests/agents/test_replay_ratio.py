"""The learner's achieved samples-per-insert metric, read from a real Reverb server."""

import numpy as np
import pytest
import reverb

from agents.d4pg.diagnostics import ReplayRatio

pytestmark = pytest.mark.timeout(60)


def _server() -> reverb.Server:
    """A "replay" table and a busier "params" table, whose counts must not be read."""
    tables = [
        reverb.Table(
            name=name,
            sampler=reverb.selectors.Uniform(),
            remover=reverb.selectors.Fifo(),
            max_size=1000,
            rate_limiter=reverb.rate_limiters.MinSize(1),
        )
        for name in ("params", "replay")
    ]
    return reverb.Server(tables=tables, port=None)


def _insert(client: reverb.Client, items: int) -> None:
    for i in range(items):
        client.insert([np.float32(i)], {"replay": 1.0})
        client.insert([np.float32(i)], {"params": 1.0})
        client.insert([np.float32(i)], {"params": 1.0})


def _sample(client: reverb.Client, samples: int) -> None:
    assert len(list(client.sample("replay", num_samples=samples))) == samples
    assert len(list(client.sample("params", num_samples=1))) == 1


def test_the_ratio_is_samples_over_inserts_since_the_last_reading():
    server = _server()
    try:
        client = reverb.Client(f"localhost:{server.port}")
        ratio = ReplayRatio(client, every=10)
        _insert(client, 5)
        _sample(client, 7)
        assert ratio.update(0) is None  # The first reading only sets the baseline.
        _insert(client, 4)
        _sample(client, 12)
        assert ratio.update(5) is None  # Not yet `every` updates since the last reading.
        assert ratio.update(10) == pytest.approx(12 / 4)
        _insert(client, 8)
        _sample(client, 2)
        assert ratio.update(20) == pytest.approx(2 / 8)
        assert ratio.update(30) is None  # Nothing inserted since: no ratio.
    finally:
        server.stop()


def test_an_unreachable_server_gives_no_ratio_and_no_error():
    server = _server()
    client = reverb.Client(f"localhost:{server.port}")
    server.stop()
    assert ReplayRatio(client, every=1).update(0) is None
