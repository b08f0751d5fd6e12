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
    several Replicators share a process (e.g. `cpu:2` then `cpu`).
    """
    physical = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(physical[0])
    configured = len(current) if current else 0
    if configured < count:
        try:
            tf.config.set_logical_device_configuration(
                physical[0], [tf.config.LogicalDeviceConfiguration()] * count
            )
        except RuntimeError as error:
            existing = len(tf.config.list_logical_devices("CPU"))
            if existing >= count:  # Initialised already, with enough devices (e.g. 1 for 1).
                return [d.name for d in tf.config.list_logical_devices("CPU")[:count]]
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
