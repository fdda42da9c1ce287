"""Stateful loops over `jax.Ref` and the discharge of refs to pure values."""
from .for_loop import StateError, for_loop, scan
