"""jaxform: a user-malleable compiler layer over JAX.

Read jaxprs as Graphs, rewrite them with passes and user rules, and hand the
result back to JAX by binding the same primitives, so that everything
composes with jit, grad, vmap and sharding.
"""
from . import passes
from .ir import Graph, Node, Value
from .optimize import PassError, filter_optimize, optimize, to_function, trace
from .state import for_loop, scan, discharge

__version__ = "0.1.0"
from .autograph import autograph, AutographError
from .rewrite import Pat, Rules, rule_by_example
from .rewriting import rewrite
from .ir.build import Builder, BuildError
from .inspect import show, explain, draw
