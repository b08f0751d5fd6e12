"""Run as a script by test_adders: an actor's writer held back by the rate limiter.

Writes 788 steps (episodes of 600 and 4 x 47) with the actors' settings into a table whose
samples-per-insert limiter only lets inserts through as a slow sampler thread samples,
so the writer's queue stays full for the whole run. Reverb's C++ writer then logs its
"pending items is alarmingly high" warning to stderr if the adder lets created plus
unconfirmed items reach 50 (Reverb's threshold). argv[1]: max_in_flight_items, or
"default" for the adder's default; argv[2] "short" (optional): also write the short
transitions from each episode's first state.
"""

import os
import sys
import threading
import time

import dm_env
import numpy as np
import reverb

from agents.d4pg.adders import NStepTransitionAdder
from agents.d4pg.builder import ACTOR_CHUNK_LENGTH
from agents.d4pg.config import D4PGConfig
from agents.d4pg.replay import REPLAY_TABLE, make_replay_server
from tests.agents.test_adders import SPEC

# One long episode (a steady full queue), then short ones, each ending 7 steps after a
# bound check (an episode's end creates n - 1 extra items at once).
EPISODE_LENGTHS = [600] + [47] * 4


def main() -> None:
    config = D4PGConfig(
        min_replay_size=10, samples_per_insert=4.0, n_step=5, transitions_per_item=1
    )
    server = make_replay_server(config, SPEC)
    client = reverb.Client(f"localhost:{server.port}")
    kwargs = {} if sys.argv[1] == "default" else {"max_in_flight_items": int(sys.argv[1])}
    short = sys.argv[2:3] == ["short"]
    adder = NStepTransitionAdder(
        client,
        config.n_step,
        action_shape=(1,),
        chunk_length=ACTOR_CHUNK_LENGTH,
        short_transitions_from_first_state=short,
        **kwargs,
    )

    def sample_slowly() -> None:
        while True:
            next(client.sample(REPLAY_TABLE, num_samples=1, emit_timesteps=False))
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample_slowly, daemon=True)
    sampler.start()
    observation = np.zeros(2, np.float32)
    for length in EPISODE_LENGTHS:
        adder.add_first(dm_env.restart(observation))
        for t in range(length):
            step = dm_env.termination if t == length - 1 else dm_env.transition
            adder.add(np.zeros(1, np.float32), step(np.float32(1.0), observation))
    print("wrote", sum(EPISODE_LENGTHS), "steps", flush=True)
    # The sampler may be blocked in the rate limiter, which would hold up a clean
    # shutdown of the server: nothing is left to check, so leave at once.
    os._exit(0)


if __name__ == "__main__":
    main()
