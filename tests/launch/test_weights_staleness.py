"""Actor weight staleness: learner steps minus the weights versions the actors act with."""

import csv
import glob

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from launch.runtime.context import FileSink, NodeContext
from launch.runtime.metrics import Progress
from launch.runtime.run_dir import RunDir

pytestmark = pytest.mark.timeout(60)


def _node(rd: RunDir, name: str) -> NodeContext:
    return NodeContext(name, rd.root, metrics_sink=FileSink(rd.metrics_path(name)))


def test_staleness_is_learner_steps_minus_the_actors_mean_version_in_csv_and_tensorboard(
    tmp_path,
):
    rd = RunDir(str(tmp_path / "run"))
    learner, evaluator = _node(rd, "learner"), _node(rd, "evaluator")
    actors = [_node(rd, f"actor_{i}") for i in range(3)]
    progress = Progress(rd, "p")
    actors[0].count(actor_steps=4000)
    learner.gauge(learner_steps=1000)
    actors[0].gauge(weights_version_actor_0=900)
    actors[1].gauge(weights_version_actor_1=700)
    actors[2].gauge(weights_version_actor_2=-1)  # Not pulled yet: not counted.
    evaluator.record("eval", **{"return": 1.0, "return_std": 0.0, "episodes": 1})
    progress.update()  # Also writes TensorBoard (the first update is >= 5 s after 0).

    assert progress.weights_staleness() == pytest.approx(1000 - (900 + 700) / 2)
    with open(rd.csv_path, newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["actor_weights_staleness"]) == pytest.approx(200.0)

    (events,) = glob.glob(rd.path("tensorboard", "launcher", "events.*"))
    accumulator = EventAccumulator(events)
    accumulator.Reload()
    # A scalar-plugin tensor summary: what TensorBoard's Scalars tab shows.
    (event,) = accumulator.Tensors("actors/weights_staleness")
    assert event.step == 4000
    assert float(tensor_util.make_ndarray(event.tensor_proto)) == pytest.approx(200.0)


def test_no_staleness_before_any_actor_holds_weights(tmp_path):
    rd = RunDir(str(tmp_path / "run"))
    _node(rd, "learner").gauge(learner_steps=10)
    _node(rd, "actor_0").gauge(weights_version_actor_0=-1)
    progress = Progress(rd, "p")
    progress.update()
    assert progress.weights_staleness() is None
    assert not glob.glob(rd.path("tensorboard", "launcher", "events.*"))
