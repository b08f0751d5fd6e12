"""D4PG's distributed program: its topology (`program`), node bodies (`nodes`), the
replay clients' reconnects (`replay_link`) and the run's policy snapshots (`snapshots`).

Built on `launch.runtime`; the maths stays in `agents.d4pg`.
"""
