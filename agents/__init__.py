"""Agents: Acme-style interfaces (`core`), an environment loop, and D4PG (`agents.d4pg`)."""

from agents.core import Actor, Adder, Learner, Saveable, VariableSource
from agents.environment_loop import EnvironmentLoop

__all__ = ["Actor", "Adder", "EnvironmentLoop", "Learner", "Saveable", "VariableSource"]
