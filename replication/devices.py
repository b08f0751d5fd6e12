"""Logical CPU devices: real replication on a machine without accelerators.

TensorFlow fixes its device list the first time it runs an op, so the split of
the host CPU into logical devices must happen before that. We detect the case
where it is too late and say what to do, instead of letting TensorFlow raise a
bare RuntimeError from deep inside `set_logical_device_configuration`.
"""

from __future__ import annotations

import tensorflow as tf


class DevicesAlreadyInitializedError(RuntimeError):
    """Asked for more logical devices after TensorFlow initialised its devices."""


def ensure_logical_cpus(count: int) -> list[str]:
    """Makes at least `count` logical CPU devices exist; returns their names.

    Idempotent: asking again for the same or a smaller count is free, which lets
    several Replicators share a process (e.g. `cpu:2` then `cpu`). A count of 1 is
    always free, even after TensorFlow initialised its devices.

    Raises:
      DevicesAlreadyInitializedError: `count` exceeds the logical CPUs TensorFlow
        already fixed in this process.
    """
    physical = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(physical[0])
    # An unconfigured CPU is one logical device: one replica needs no configuration,
    # so `make("cpu")` works after TensorFlow has run ops (as in any notebook).
    configured = len(current) if current else 1
    if configured < count:
        try:
            tf.config.set_logical_device_configuration(
                physical[0], [tf.config.LogicalDeviceConfiguration()] * count
            )
        except RuntimeError as error:
            existing = len(tf.config.list_logical_devices("CPU"))
            raise DevicesAlreadyInitializedError(
                f"Cannot create {count} logical CPU devices: TensorFlow already "
                f"initialised its devices in this process with {existing} logical "
                "CPU device(s), and the device list cannot change afterwards. "
                f"Call replication.make('cpu:{count}') (or "
                f"replication.ensure_logical_cpus({count})) before any other "
                "TensorFlow operation in this process, or run each replication "
                "spec in its own process."
            ) from error
    logical = tf.config.list_logical_devices("CPU")
    return [device.name for device in logical[:count]]
