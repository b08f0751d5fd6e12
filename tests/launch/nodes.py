"""Tiny real node bodies for supervision tests (no TF): a TCP server, clients, counters.

Also runnable as ``python -m tests.launch.nodes RUN_DIR BACKEND`` to launch a demo
program in a separate launcher process (for signal and kill -9 tests).
"""

import os
import socket
import sys
import time

from launch.runtime import launcher
from launch.runtime.program import NEVER_RESTART, Node, Program, Ref, RestartPolicy


def server(ctx):
    """Serves a line-based TCP counter on loopback; publishes its address."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.2)
    ctx.publish("server_address", f"{ctx.advertise_host}:{sock.getsockname()[1]}")
    ctx.gauge(**{f"pid_{ctx.name}": os.getpid()})
    served = 0
    while not ctx.should_stop():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        with conn:
            served += 1
            conn.sendall(f"{served}\n".encode())
    sock.close()
    with open(ctx.path("server_stopped.txt"), "w") as f:
        f.write(str(served))


def client(ctx, *, address, interval=0.05):
    """Asks the server for a number repeatedly; counts the requests."""
    ctx.gauge(**{f"pid_{ctx.name}": os.getpid()})
    host, port = address.rsplit(":", 1)
    while not ctx.wait(interval):
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.recv(64)
        ctx.count(actor_steps=1)


def counter(ctx, *, tick=0.05, crash_on_attempt=-1, crash_after=5, ignore_stop=False):
    """Counts ticks; raises on attempt `crash_on_attempt` after `crash_after` ticks."""
    ctx.gauge(**{f"pid_{ctx.name}": os.getpid(), f"attempt_{ctx.name}": ctx.attempt})
    ticks = 0
    while ignore_stop or not ctx.should_stop():
        time.sleep(tick)
        ticks += 1
        ctx.count(**{f"ticks_{ctx.name}": 1})
        if ctx.attempt == crash_on_attempt and ticks >= crash_after:
            raise RuntimeError(f"{ctx.name} crashes on purpose")


def beating(ctx, *, tick=0.05, quiet_start=0.0, hang_on_attempt=-1, hang_after=10):
    """Sends a heartbeat every tick, after `quiet_start` seconds without any (a slow
    start-up); on attempt `hang_on_attempt` it hangs after `hang_after` ticks, deaf to
    stop requests, as a worker blocked in a collective whose peer is gone."""
    ctx.gauge(**{f"pid_{ctx.name}": os.getpid(), f"attempt_{ctx.name}": ctx.attempt})
    time.sleep(quiet_start)
    ticks = 0
    while not ctx.should_stop():
        ctx.heartbeat()
        time.sleep(tick)
        ticks += 1
        if ctx.attempt == hang_on_attempt and ticks >= hang_after:
            while True:
                time.sleep(1.0)


def failing(ctx):
    raise RuntimeError("this node always fails")


def broken_import(ctx):
    """Fails like a node whose code needs a module that is not installed."""
    ctx.log("importing a module that does not exist")
    import a_module_that_does_not_exist  # noqa: F401


def crash_every_time(ctx, *, after=0.1):
    ctx.log(f"attempt {ctx.attempt}: crashing in {after}s")
    time.sleep(after)
    raise RuntimeError(f"crash number {ctx.attempt + 1}")


def fails_on_stop(ctx):
    """Works until asked to stop, then fails to save (like a learner whose disk is full)."""
    ctx.gauge(**{f"pid_{ctx.name}": os.getpid()})
    while not ctx.wait(0.05):
        pass
    raise OSError(f"{ctx.name}: cannot write the final save")


def slow_saver(ctx, *, save_s=3.0, need_s=None):
    """Works until asked to stop, then takes `save_s` to save (like a replay checkpoint);
    asks for `need_s` seconds to stop first if given."""
    if need_s is not None:
        ctx.need_stop_time(need_s)
    while not ctx.wait(0.05):
        pass
    with open(ctx.path("saving.txt"), "w") as f:
        f.write("saving\n")
    time.sleep(save_s)
    with open(ctx.path("saved.txt"), "w") as f:
        f.write("saved\n")


def numbered(ctx, *, every_s=0.005):
    """Records 0, 1, 2, ... every `every_s` until stopped, then one "last" with the count."""
    n = 0
    while not ctx.wait(every_s):
        ctx.record("numbered", n=n)
        n += 1
    ctx.record("last", count=n)


def moving_server(ctx):
    """A server that takes a new port on every start (like a replay moved by Ray)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.2)
    ctx.gauge(**{f"pid_{ctx.name}": os.getpid()})
    ctx.publish("server_address", f"{ctx.advertise_host}:{sock.getsockname()[1]}")
    while not ctx.should_stop():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        with conn:
            conn.sendall(b"1\n")


def address_user(ctx, *, address, ignore_stop=False):
    """Records the address it was started with; then polls the server (down: retries).

    With `ignore_stop` it never returns, like a client blocked in a call to a dead server.
    """
    ctx.gauge(**{f"address_{ctx.name}": address})
    host, port = address.rsplit(":", 1)
    while not ctx.wait(0.05) or ignore_stop:
        try:
            with socket.create_connection((host, int(port)), timeout=5) as conn:
                conn.recv(64)
        except OSError:
            continue
        ctx.count(actor_steps=1)


def demo_program(stubborn=False):
    nodes = [
        Node("server", "tests.launch.nodes:server", restart=NEVER_RESTART, stop_phase=1),
        Node(
            "client",
            "tests.launch.nodes:client",
            {"address": Ref("server_address")},
            restart=RestartPolicy(initial_backoff=0.2),
        ),
        Node("counter", "tests.launch.nodes:counter", {"ignore_stop": stubborn}),
    ]
    return Program("demo", nodes)


def slow_saver_program():
    """A saver that needs 3 s to save and asks for 10 s, with a fixed 1 s stop timeout."""
    saver = Node(
        "saver", "tests.launch.nodes:slow_saver", {"save_s": 3.0, "need_s": 10.0}, stop_timeout=1.0
    )
    return Program("slow-saver", [saver, Node("counter", "tests.launch.nodes:counter")])


if __name__ == "__main__":
    run_dir, backend = sys.argv[1], sys.argv[2]
    slow = "slow-saver" in sys.argv
    outcome = launcher.run(
        slow_saver_program() if slow else demo_program(stubborn="stubborn" in sys.argv),
        run_dir,
        backend,
        stop_grace=2.0,
        progress_every=1.0,
        env={"PYTHONPATH": os.getcwd()} if backend == "local" else None,
    )
    print("OUTCOME", outcome.reason, flush=True)


def report_env(ctx, group_addresses=None):
    """Records the GPUs it may see, its group addresses and its Ray node; waits for a stop."""
    import os

    node_id = None
    try:
        import ray

        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    ctx.record(
        "env",
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        group_addresses=group_addresses,
        advertise_host=ctx.advertise_host,
        ray_node_id=node_id,
    )
    while not ctx.wait(0.1):
        pass
