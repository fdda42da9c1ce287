"""Stateful loops over `jax.Ref` and the discharge of refs to pure values."""
from .discharge import discharge
from .for_loop import StateError, for_loop, scan

__all__ = ["for_loop", "scan", "discharge", "StateError"]
