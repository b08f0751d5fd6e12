"""Programs of nodes: what to run, independent of where and how it runs.

A `Program` is a list of `Node`s. A node is a named entry point (``"module:function"``)
plus keyword arguments that are plain JSON data, a resource request and a restart
policy. Because a node is only data, every backend (threads, local processes, Ray
actors) can ship it to wherever it runs without pickling code.

Nodes find each other through *published values*: a node body calls
``ctx.publish("replay_address", "host:port")`` and another node's arguments say
``Ref("replay_address")``. A backend starts a node only once every value it
refers to has been published, then substitutes the values.

Example:

>>> program = Program("demo", [
...     Node("server", "mypkg.nodes:serve", {"port": 0}),
...     Node("client", "mypkg.nodes:poll", {"address": Ref("server_address")}),
... ])
>>> [n.name for n in program.nodes]
['server', 'client']
>>> program.node("client").refs()
['server_address']
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
from collections.abc import Callable, Iterator
from typing import Any

from launch.runtime.errors import NodeStartupError

_REF_KEY = "$ref"
# The keyword argument a backend adds to every member of a node group.
GROUP_ADDRESSES = "group_addresses"


def Ref(key: str) -> dict:  # noqa: N802 (reads as a type at call sites)
    """A placeholder for a value another node publishes under `key`."""
    return {_REF_KEY: key}


def _walk_refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if set(value) == {_REF_KEY}:
            yield value[_REF_KEY]
            return
        for v in value.values():
            yield from _walk_refs(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _walk_refs(v)


def resolve_refs(value: Any, published: dict[str, Any]) -> Any:
    """Returns `value` with every `Ref(key)` replaced by `published[key]`."""
    if isinstance(value, dict):
        if set(value) == {_REF_KEY}:
            return published[value[_REF_KEY]]
        return {k: resolve_refs(v, published) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [resolve_refs(v, published) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class Resources:
    """What a node asks of the machine it runs on (used by the Ray backend).

    Attributes:
      cpus: CPU cores to reserve (fractions allowed).
      gpus: GPUs to reserve.
      custom: Ray custom resources, e.g. ``{"learner_host": 1}`` to pin the learner.
      spread: Ask Ray to spread nodes with this flag over the Ray nodes that fit
        (``SPREAD`` scheduling), e.g. actors; otherwise Ray packs them.

    `gpus` is also what the local backend honours: a node with ``gpus=0`` runs with
    ``CUDA_VISIBLE_DEVICES=""``, one with ``gpus=n`` gets n GPUs of its own.
    """

    cpus: float = 1.0
    gpus: float = 0.0
    custom: dict[str, float] = dataclasses.field(default_factory=dict)
    spread: bool = False


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """What the supervisor does when a node's process or body fails.

    Attributes:
      restart: Restart the node after a failure; if False a failure stops the run.
      initial_backoff: Seconds to wait before the first restart.
      max_backoff: Cap on the doubling wait between consecutive restarts.
      max_consecutive_failures: A node that fails this many times in a row, each
        time within `healthy_after` seconds of starting, stops the run.
      healthy_after: Seconds of running after which a node counts as healthy and
        its backoff resets.
      fatal_hint: Appended to the message when a failure of this node stops the run.
      max_restarts: The restart budget: a node that would be restarted more than this
        many times within `restart_window` seconds stops the run instead (a node that
        crashes after every restore, however long it ran, cannot restart forever).
      restart_window: The budget's sliding window, in seconds.
      max_total_restarts: A cap on restarts over the whole launch: a crash loop slower
        than the window (a node that fails a minute after each start) stops the run
        after this many restarts instead of looping for ever.

    Failures a restart cannot cure (`launch.runtime.errors.is_deterministic`: import errors,
    bad arguments or config) stop the run at the first occurrence, whatever the policy.
    """

    restart: bool = True
    initial_backoff: float = 1.0
    max_backoff: float = 30.0
    max_consecutive_failures: int = 10
    healthy_after: float = 60.0
    fatal_hint: str = ""
    max_restarts: int = 10
    restart_window: float = 600.0
    max_total_restarts: int = 30

    def backoff(self, consecutive_failures: int) -> float:
        """Seconds to wait before restart number `consecutive_failures` (1-based)."""
        return min(self.max_backoff, self.initial_backoff * 2 ** max(0, consecutive_failures - 1))


NEVER_RESTART = RestartPolicy(restart=False)


@dataclasses.dataclass(frozen=True)
class Node:
    """One entry point of a program.

    Attributes:
      name: Unique name within the program (also names its log and metrics files).
      entry_point: ``"package.module:function"``; called as ``function(ctx, **kwargs)``
        with a `launch.NodeContext`.
      kwargs: JSON-able keyword arguments; may contain `Ref` placeholders.
      resources: The resource request.
      restart: The restart policy.
      stop_phase: Nodes stop in increasing phases on shutdown, so e.g. a server
        (a late phase) outlives its clients and can save state last.
      stop_timeout: Seconds the node gets to return after a stop request before it
        is killed (a stateless node stuck in a blocking call needs little).
      group: Nodes with the same non-empty group are one unit (e.g. the workers of
        one multi-worker learner): started together, and when one fails the others
        are stopped and all restart together. Each member receives the keyword
        argument ``group_addresses`` (`GROUP_ADDRESSES`): one ``host:port`` per
        member, in program order, on a port the backend reserved on the host that
        member runs on.
      stateless: The node keeps nothing worth saving (e.g. an actor), so being killed
        at its stop deadline, or failing while it stops, loses nothing and does not
        make the run's exit status a failure.
      may_finish: The body may return by itself, its work done (a finite job). A node
        without it that returns unasked (it got a stop signal of its own, e.g. SIGTERM
        from an out-of-memory killer) has failed, and its restart policy applies, like
        supervisord's ``autorestart=unexpected``: a run must not stall on a node that is
        gone while the launcher believes it finished.
      stall_timeout: Seconds without a `NodeContext.heartbeat` after which a running
        node counts as stuck: it is killed and fails (its restart policy applies; a
        group restarts as a whole). Armed by the body's first heartbeat of each start,
        so start-up and restores are not timed. 0: no watchdog. For bodies that can
        block without a deadline, e.g. learner workers in a collective whose peer hangs.
    """

    name: str
    entry_point: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    resources: Resources = Resources()
    restart: RestartPolicy = RestartPolicy()
    stop_phase: int = 0
    stop_timeout: float = 10.0
    group: str = ""
    stateless: bool = False
    may_finish: bool = False
    stall_timeout: float = 0.0

    def __post_init__(self):
        if ":" not in self.entry_point:
            raise ValueError(
                f"Node {self.name!r}: entry_point must look like 'module:function', "
                f"got {self.entry_point!r}."
            )
        if self.stall_timeout < 0:
            raise ValueError(
                f"Node {self.name!r}: stall_timeout must be 0 (off) or a positive number of "
                f"seconds, got {self.stall_timeout!r}."
            )
        try:
            json.dumps(self.kwargs)
        except TypeError as e:
            raise TypeError(f"Node {self.name!r}: kwargs must be plain JSON data ({e}).") from None

    def refs(self) -> list[str]:
        """Keys of the published values this node waits for."""
        return sorted(set(_walk_refs(self.kwargs)))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Node:
        data = dict(data)
        data["resources"] = Resources(**data["resources"])
        data["restart"] = RestartPolicy(**data["restart"])
        return cls(**data)


def load_entry_point(entry_point: str) -> Callable[..., Any]:
    """Imports ``"module:function"`` and returns the function."""
    module_name, _, attr = entry_point.partition(":")
    module = importlib.import_module(module_name)
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part)
    return fn


def check_arguments(fn: Callable[..., Any], ctx: Any, kwargs: dict) -> None:
    """Raises `NodeStartupError` when `kwargs` do not fit the entry point (a config bug)."""
    try:
        inspect.signature(fn).bind(ctx, **kwargs)
    except TypeError as e:
        raise NodeStartupError(f"bad arguments for {fn.__module__}.{fn.__name__}: {e}") from None


@dataclasses.dataclass
class Program:
    """A named set of nodes that together make one distributed job.

    Attributes:
      name: Shown in progress lines.
      nodes: The nodes.
      setup: Optional ``(entry_point, kwargs)`` called once, before any node, when all
        nodes share one process (the threads backend), e.g. to configure devices that
        must be set before TensorFlow starts. Separate processes do their own setup.
    """

    name: str
    nodes: list[Node]
    setup: tuple[str, dict[str, Any]] | None = None

    def __post_init__(self):
        names = [n.name for n in self.nodes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"Program {self.name!r} has duplicate node names: {duplicates}.")
        for node in self.nodes:
            if node.group and GROUP_ADDRESSES in node.kwargs:
                raise ValueError(
                    f"Node {node.name!r} is in group {node.group!r}: its backend sets "
                    f"{GROUP_ADDRESSES!r}; do not pass it."
                )

    def group(self, name: str) -> list[Node]:
        """The members of node group `name`, in program order."""
        return [n for n in self.nodes if n.group == name]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(
            f"No node {name!r} in program {self.name!r}; nodes: {[n.name for n in self.nodes]}."
        )
