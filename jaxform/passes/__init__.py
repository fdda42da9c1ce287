"""Passes: functions Graph -> Graph (they may edit their input in place).

Each pass is registered with a name and whether it is *exact* (results bit for
bit equal) or reassociating; `optimize(exact=True)` keeps only exact ones.
The default pipeline is `DEFAULT`, in order.
"""
from __future__ import annotations

from typing import Callable

from ..ir import Graph

from .registry import PASSES, get, register  # noqa: E402,F401

from .dce import dce  # noqa: E402
from .cse import cse  # noqa: E402
from .inline import inline  # noqa: E402
from .algebra import algebra, algebra_exact  # noqa: E402
from .licm import hoist_loop_invariants  # noqa: E402
from .outline import outline  # noqa: E402
from .scan_reductions import fuse_scan_reductions  # noqa: E402
from .fission import fission  # noqa: E402
from .remat_loops import remat_loops, with_memory as remat_loops_with  # noqa: E402
from .residual_stacks import thin_residuals  # noqa: E402
from .stream_rows import stream_rows  # noqa: E402
from ..state.ref_loops import scans_from_ref_loops, has_ref_loops  # noqa: E402

# Loops over refs (JAX 0.12's Scan3 under jax_scan3) read as scans; `run_passes` puts it first by itself.
register("scans_from_ref_loops", exact=True)(scans_from_ref_loops)

from .while_grad import while_grad, with_options as while_grad_with  # noqa: E402
from .remat_program import remat_program, with_memory as remat_program_with  # noqa: E402

# Order: stream_rows reads a loop's buffer rows as the discharged for_loop wrote them (before hoisting moves
# their index arithmetic); hoisting makes a residual's operands loop constants before sum_then_pull_back looks for them;
# fusion pulls the loss into the body before fission batches its carry-free work out of the loop
# (the other way round fission would stack cos(xs) and leave fusion nothing); thin_residuals runs once
# the loops' bodies are final (it reads which rows a reverse loop already reads); remat_loops
# (optimize's memory=) plans the loops last, once they hold what they will hold.
DEFAULT = ["inline", "cse", "stream_rows", "hoist_loop_invariants", "sum_then_pull_back", "fuse_scan_reductions", "fission",
           "thin_residuals", "dce"]


def default_pipeline(exact: bool = False) -> list[Callable[[Graph], Graph]]:
    ps = [PASSES[n] for n in DEFAULT if n in PASSES]
    return [p for p in ps if p.exact] if exact else ps


def memory_pipeline(memory, max_steps: int | None = None, name: str = "") -> list[Callable[[Graph], Graph]]:
    """What `memory=` appends to a pipeline (`optimize` and `explain` alike): while loops made differentiable
    within a bound, then loop memory planning (which then also plans the bounded loops' enclosing scans),
    then segment checkpointing. One owner of a byte budget: remat_loops fits the loops, remat_program the
    rest and says what is unmet."""
    return [while_grad_with(memory, max_steps, name), remat_loops_with(memory, warn=False),
            remat_program_with(memory)]


__all__ = ["PASSES", "DEFAULT", "register", "get", "default_pipeline", "memory_pipeline", "dce", "cse", "inline"]
