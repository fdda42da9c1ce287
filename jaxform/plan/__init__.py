"""Planning: which loop rewrites the default pipeline keeps, decided on what the machine reports.

`use` says how a call is traced (forward, grad, vmap) and which program each candidate is judged as;
`measure` asks XLA (temp bytes) and the device (time), with an on-disk cache; `cost` is the model that
stands in where measuring is not possible or not needed; `planner` decides; `memory` picks loop and
straight-line schedules for `memory=`; `tune` is `tune=True`'s timing, kept for its cache.
"""
from . import cost, memory  # memory installs the memory passes' deciders (passes.decisions)
from .cost import Estimate, Machine, device_memory_limit, estimate, machine, planning_for
from .planner import Cost, Decision, Plan, ViewCost, plan
from .use import FORWARD, UNKNOWN, Use, use_of

__all__ = ["Estimate", "Machine", "estimate", "machine", "planning_for", "device_memory_limit", "Decision", "Plan",
           "Cost", "ViewCost", "plan", "Use", "use_of", "FORWARD", "UNKNOWN"]
