"""Planning: the cost model (`cost`) and the planner (`planner`) that decides, with it and the user's
objective, which loop rewrites the default pipeline keeps; `tune` measures where the model cannot decide."""
from . import cost
from .cost import Estimate, Machine, device_memory_limit, estimate, machine, planning_for
from .planner import Decision, Plan, plan

__all__ = ["Estimate", "Machine", "estimate", "machine", "planning_for", "device_memory_limit", "Decision", "Plan",
           "plan"]
