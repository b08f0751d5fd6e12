"""Distributed D4PG (Barth-Maron et al., 2018) on Reverb and `replication`.

Modules: `config` (hyperparameters), `networks` (Sonnet), `numpy_policy` (fast acting),
`losses` (maths), `replay` (Reverb tables), `adders` (n-step writer), `variables` (weight
transport), `learning` (the replicated update), `acting` (actor/evaluator), `builder`
(wiring used by `launch/`), `local_runner` (everything in one process), `snapshot` (the
policy as a self-contained TF SavedModel).
"""

from agents.d4pg.acting import D4PGActor
from agents.d4pg.builder import make_actor, make_environment, make_evaluator, make_learner
from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import D4PGLearner, ReplayTimeoutError, Transition
from agents.d4pg.local_runner import RunResults, run_single_process
from agents.d4pg.replay import PARAMS_TABLE, REPLAY_TABLE, make_replay_server

__all__ = [
    "PARAMS_TABLE",
    "REPLAY_TABLE",
    "D4PGActor",
    "D4PGConfig",
    "D4PGLearner",
    "ReplayTimeoutError",
    "RunResults",
    "Transition",
    "make_actor",
    "make_environment",
    "make_evaluator",
    "make_learner",
    "make_replay_server",
    "run_single_process",
]
