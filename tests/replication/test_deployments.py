"""Spec parsing and the errors users see for bad specs or late device requests."""

import pytest
import tensorflow as tf

import replication
from tests.support import run_python


@pytest.mark.parametrize(
    "spec, kind, replicas, per_replica",
    [
        ("cpu", "cpu", 1, 1),
        ("cpu:4", "cpu", 4, 1),
        ("CPU:2x2", "cpu", 2, 2),
        ("gpu", "gpu", None, 1),
        ("gpu:8", "gpu", 8, 1),
        ("multiworker", "multiworker", None, 1),
        ("ps", "ps", None, 1),
        ("tpu", "tpu", None, 1),
    ],
)
def test_parse_valid_specs(spec, kind, replicas, per_replica):
    deployment = replication.parse(spec)
    assert (deployment.kind, deployment.replicas, deployment.devices_per_replica) == (
        kind,
        replicas,
        per_replica,
    )


def test_tpu_address_is_kept_verbatim():
    assert replication.parse("tpu:grpc://10.0.0.2:8470").address == "grpc://10.0.0.2:8470"


@pytest.mark.parametrize("spec", ["", "cpus", "cpu:", "cpu:0", "cpu:two", "gpu:0", "mirrored", 3])
def test_bad_specs_list_every_valid_form(spec):
    with pytest.raises(replication.DeploymentSpecError) as error:
        replication.parse(spec)
    message = str(error.value)
    for form in ("cpu", "cpu:N", "gpu", "multiworker", "tpu", "ps"):
        assert form in message


def test_make_rejects_bad_spec_before_touching_devices():
    with pytest.raises(ValueError, match="Valid forms"):
        replication.make("cpu:x")


def test_more_logical_devices_after_initialisation_explains_what_to_do():
    tf.constant(1.0) + 1.0  # devices are initialised by now (conftest made 4)
    with pytest.raises(replication.DevicesAlreadyInitializedError) as error:
        replication.make("cpu:64")
    message = str(error.value)
    assert "already initialised" in message and "before any other" in message


def test_gpu_spec_without_gpu_is_a_clear_error():
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="no GPU"):
        replication.make("gpu")


def test_multiworker_without_cluster_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(RuntimeError, match="TF_CONFIG"):
        replication.make("multiworker")


def test_a_multiworker_heartbeat_timeout_must_be_positive():
    # Checked before any cluster is contacted: nothing listens on this address.
    with pytest.raises(ValueError, match="heartbeat_timeout"):
        replication.make("multiworker", workers=["localhost:1"], task_index=0, heartbeat_timeout=0)


def test_replicas_share_one_process():
    assert replication.make("cpu:2").num_replicas == 2
    assert replication.make("cpu:4").num_replicas == 4
    assert replication.make("cpu").num_replicas == 1


ONE_REPLICA_AFTER_TF_OPS = """
import tensorflow as tf
import replication
tf.constant(1.0) + 1.0  # TensorFlow fixes its devices here, as in any notebook
for spec in ("cpu", "cpu:1"):
    repl = replication.make(spec)
    assert repl.num_replicas == 1, spec
    out = repl.run(tf.function(lambda: tf.constant(2.0) * 3.0))
    assert float(out) == 6.0, spec
try:
    replication.make("cpu:2")
except replication.DevicesAlreadyInitializedError as error:
    assert "before any other" in str(error)
    print("REFUSED cpu:2")
"""


def test_one_replica_works_after_tensorflow_initialised_but_more_is_refused():
    result = run_python(ONE_REPLICA_AFTER_TF_OPS, timeout=120)
    assert "REFUSED cpu:2" in result.stdout
