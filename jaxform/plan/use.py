"""The use a function is traced under, and the program each candidate is judged as.

`optimize(f)` plans at its first call for a signature, and its inputs say how the result will be used:
linearize tracers mean `jax.grad`/`vjp` (plan the gradient program, w.r.t. exactly those inputs), batch
tracers mean `jax.vmap` (plan the batched program), concrete arrays mean a forward call. A jit tracer
says nothing (`jax.grad(jax.jit(optimize(f)))` traces `f` before the gradient exists), so that use is
*unknown*: the planner then weighs the forward program and the gradient of every float input, and a
rewrite must be no worse in both (what `jax.jit` of either would run).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from .. import _jax

MAX_LEVELS = 4     # nested transformations read from the inputs (deeper ones are not told apart)
# Under an unknown use the gradient is a view the call may never run: its XLA bytes are held to the model's
# 1% resolution, not to the byte (a fused loss adds a few carries to it; refusing fusion's 40x forward win
# for 64 bytes of a gradient nobody asked for would undo the rewrite the user called `optimize` for).
HYPOTHETICAL_GRAD = "grad (if used)"
# Under a known gradient use, outputs beside a scalar loss may be `has_aux` outputs that get no cotangent (the
# inputs cannot tell `jax.grad(f, has_aux=True)` from `jax.vjp`): a rewrite must also be no bigger in the
# gradient of that loss alone, the others returned as values (a scanned aux: fission's batched op
# looked free in the all-outputs gradient, which stores it anyway, and took 19x plain's memory).
AUX_GRAD = "grad of one scalar output alone (has_aux)"     # one view per scalar output: `aux_view(k)`
NO_VALUE = " (loss value dropped)"     # ... as `jax.grad(f, has_aux=True)` runs it: `aux_view(k, value=False)`
AUX_VIEWS = 3      # at most this many scalar outputs judged as a has_aux loss each (one compile per candidate each)
# ... and no bigger with the value returned (`jax.value_and_grad`, which the inputs cannot tell from `jax.grad`:
# a loop the gradient does not need is in it; sin/cos w.r.t. x1 took 26200 B against plain's 25688 B) nor
# without it (a fused loss kept "no bigger" with its value took 8708 B against 8388 B in `jax.grad` alone).
WITH_VALUE = " (value returned)"


@dataclass(frozen=True)
class Use:
    """How the program is used: `steps` are the transformations applied to it, first applied first:
    ("grad", wrt) with the differentiated input indices, ("vmap", axes, size) with each input's batch
    axis (None: not batched), ("jvp", wrt) forward mode w.r.t. those inputs; `known` is False when nothing
    told (a jit tracer)."""
    steps: tuple = ()
    known: bool = True

    @property
    def label(self) -> str:
        if not self.known:
            return "forward and grad (use unknown under jit)"
        out = "forward"
        if self.steps and isinstance(self.steps[0], str):     # a named forward program (a gradient already)
            return f"forward ({self.steps[0]})"
        for s in self.steps:
            out = f"{s[0]}({out})" if out != "forward" else ("grad" if s[0] == "grad" else f"{s[0]}(forward)")
        return out

    @property
    def differentiated(self) -> bool:
        return not self.known or any(isinstance(s, str) or s[0] == "grad" for s in self.steps)

    def differentiates(self, view: str) -> bool:
        """Is `view` a gradient, the program a memory pass (what the loops store for the backward) acts on?
        Not the forward of a program that is already a gradient: it is run as it is, never differentiated."""
        if view == HYPOTHETICAL_GRAD:
            return True
        return (view in (self.label, self.label + WITH_VALUE) or view.startswith(AUX_GRAD)) and \
            any(isinstance(s, tuple) and s[0] == "grad" for s in self.steps)

    def views(self, closed=None) -> tuple[str, ...]:
        """The programs a candidate is judged as, by name: one per use, two when the use is unknown; under a
        gradient, its value returned too, and each scalar output of `closed` as a has_aux loss (`aux_view`).
        A function returning (loss, aux) (`loss_and_aux`) is judged as has_aux runs it, with and without the
        loss's value, as a one-output function is as `jax.grad` and `jax.value_and_grad` run it; the VJP of
        every output (`jax.vjp`) only in the final guard (`guarded_views`): judging it per candidate too was
        half of each candidate's compiles (round 17's K: 19 compiles where a one-output RNN takes 6)."""
        if not self.known:
            return ("forward", HYPOTHETICAL_GRAD)
        if not self._gradient_first():
            return (self.label,)
        if self._pair(closed):
            return (aux_view(0, value=False), aux_view(0))
        aux = tuple(aux_view(k) for k in aux_losses(closed)) if closed is not None else ()
        return (self.label, self.label + WITH_VALUE) + aux

    def guarded_views(self, closed) -> tuple[str, ...]:
        """Views the final guard holds the chosen program to beside `views` ("never bigger" in each): for a
        (loss, aux) function, the VJP of every output, with and without the values."""
        return (self.label, self.label + WITH_VALUE) if self._gradient_first() and self._pair(closed) else ()

    def _gradient_first(self) -> bool:
        return bool(self.steps) and isinstance(self.steps[0], tuple) and self.steps[0][0] == "grad"

    @staticmethod
    def _pair(closed) -> bool:
        return closed is not None and loss_and_aux() and aux_losses(closed) == [0]

    def program(self, closed, view: str):
        """`closed` as `view` runs it (a jaxpr), or None where JAX cannot build it (nothing to differentiate).
        The gradient's views (`views`): as `jax.grad` runs it; with its value returned too, as
        `jax.value_and_grad` does; and of each scalar output alone (`aux_losses`), the others returned (`has_aux`)."""
        if view == "forward":
            return closed
        if view == HYPOTHETICAL_GRAD and not self.known:
            return gradient_program(closed)     # (the final guard measures it behind a jit boundary, as JAX runs it)
        loss = aux_index(view)
        if view.startswith(AUX_GRAD) and loss not in aux_losses(closed):
            return None     # no such scalar float output beside others: no has_aux call to judge
        grads = [k for k, s in enumerate(self.steps) if isinstance(s, tuple) and s[0] == "grad"]
        for k, s in enumerate(self.steps):
            if closed is None or not isinstance(s, tuple):
                continue
            if s[0] == "grad":
                closed = gradient_program(closed, s[1], with_value=k == grads[-1] and view != self.label and
                                          not view.endswith(NO_VALUE),
                                          outs=(loss,) if loss is not None and k == 0 else None)
            elif s[0] == "vmap":
                closed = batched_program(closed, s[1], s[2])
            elif s[0] == "jvp":
                closed = jvp_program(closed, s[1])
        return closed


FORWARD = Use()
UNKNOWN = Use(known=False)


def use_of(leaves) -> Use:
    """The use that the flat inputs of a call tell (see the module docstring)."""
    cur = list(leaves)
    if not any(isinstance(x, _jax.Tracer) for x in cur):
        return FORWARD
    steps = []
    for _ in range(MAX_LEVELS):
        found = [(_jax.trace_depth(x), i, t) for i, x in enumerate(cur) if (t := _jax.transformation_of(x))]
        if not found:
            break
        depth = max(d for d, _, _ in found)
        level = [(i, t) for d, i, t in found if d == depth]
        kind = level[0][1][0]
        level = [(i, t) for i, t in level if t[0] == kind]
        if kind == "grad":
            steps.append(("grad", tuple(i for i, _ in level)))
        elif kind == "vmap":
            axes = [None] * len(cur)
            for i, t in level:
                axes[i] = t[2]
            size = next((t[3] for _, t in level if t[3] is not None), None)
            if size is not None:
                steps.append(("vmap", tuple(axes), size))
        elif kind == "jvp":     # forward mode: judged as the program jax.jvp runs (primal and tangent together)
            steps.append(("jvp", tuple(i for i, _ in level)))
        for i, t in level:
            cur[i] = t[1]
    if not steps and any(isinstance(x, _jax.Tracer) for x in cur):
        return UNKNOWN
    return Use(tuple(steps))


_LOSS_AND_AUX: contextvars.ContextVar = contextvars.ContextVar("jaxform_loss_and_aux", default=False)


@contextlib.contextmanager
def returns_loss_and_aux(pair: bool):
    """`optimize` tells the planner that the function returns what `jax.grad(f, has_aux=True)` takes: a pair
    whose first element is one float scalar. Then that gradient's loss is output 0, and the other order can be
    named for it (round 21's A2: a dict's loss flattens anywhere, a pair's first), and a budget is fitted to that
    loss alone (`aux_losses`), the other outputs' gradients checked after (round 17's K: 26 compiles where 6 do)."""
    token = _LOSS_AND_AUX.set(bool(pair))
    try:
        yield
    finally:
        _LOSS_AND_AUX.reset(token)


def loss_and_aux() -> bool:
    return _LOSS_AND_AUX.get()


def aux_losses(closed) -> list[int]:
    """The outputs `jax.grad(f, has_aux=True)` could differentiate, if `closed` could be called so: output 0
    where the function returns a pair with a float scalar first (`loss_and_aux`: has_aux takes that one), else
    each float scalar among several outputs (`scalar_outputs`)."""
    scalars = scalar_outputs(closed)
    return [0] if loss_and_aux() and scalars[:1] == [0] else scalars


def scalar_outputs(closed) -> list[int]:
    """Each float scalar among several outputs (AUX_VIEWS of them at most: the first ones and the last). Not only
    output 0: `{"loss": l, "aux": a}` flattens the aux first; nor only the first scalar: `{"acc": mean(a), "aux":
    a, "loss": l}` flattens the accuracy first (attacks: 19x plain's bytes where only output 0, then only the
    first scalar, was judged)."""
    outs = closed.out_avals
    if len(outs) < 2:
        return []
    scalars = [i for i, a in enumerate(outs) if a.shape == () and jnp.issubdtype(a.dtype, jnp.floating)]
    # past AUX_VIEWS: the first ones and the last (metrics before the loss: `{"a1".., "aux", "loss"}`)
    return scalars if len(scalars) <= AUX_VIEWS else scalars[:AUX_VIEWS - 1] + scalars[-1:]


def aux_view(k: int, value: bool = True) -> str:
    """The view of output `k` as the has_aux loss, the others returned without a cotangent; with the loss's
    value (`jax.value_and_grad(f, has_aux=True)`) or, value=False, without (`jax.grad(f, has_aux=True)`)."""
    return f"{AUX_GRAD} #{k}" + ("" if value else NO_VALUE)


def aux_index(view: str) -> int | None:
    """The output `aux_view` names, or None for any other view."""
    return int(view[len(AUX_GRAD) + 2:].removesuffix(NO_VALUE)) if view.startswith(AUX_GRAD + " #") else None


def without_value(view: str) -> str | None:
    """The view that runs `view`'s gradient without returning the value (its twin: the same work), or None."""
    if view.endswith(WITH_VALUE):
        return view[:-len(WITH_VALUE)]
    return view + NO_VALUE if aux_index(view) is not None and not view.endswith(NO_VALUE) else None


_TRACED_GRADIENTS: contextvars.ContextVar = contextvars.ContextVar("jaxform_traced_gradients", default=None)


@contextlib.contextmanager
def gradients_remembered():
    """Within one plan, each gradient program (and batched program, `batched_program`) is traced once: a budget's
    baseline and the final guard ask for the same one (nanoGPT: 0.5 s a trace). Keyed by the program object,
    which the memo keeps alive."""
    token = _TRACED_GRADIENTS.set({})
    try:
        yield
    finally:
        _TRACED_GRADIENTS.reset(token)


def gradient_program(closed, wrt=None, through_jit: bool = False, with_value: bool = False, outs=None,
                     aux: bool = True):
    """The jaxpr `jax.grad` would run for this program (VJP of every float output with ones w.r.t.
    every float input, or the inputs `wrt`), or None where there is nothing to differentiate or JAX cannot.
    through_jit: as `jax.grad(jax.jit(f))` runs it, the program behind a jit boundary (JAX's partial
    evaluation of the call then decides the residuals: 16816 B where the inlined VJP takes 16744 B).
    with_value: as `jax.value_and_grad` runs it, the outputs returned too (XLA can schedule that program
    bigger: an MLP's 3.00 MiB gradient took 3.50 MiB with its value, JAX 0.10.2); every output is then
    returned, and `outs` (output indices) limits the cotangents to those (`jax.grad(f, has_aux=True)`, which
    returns the other outputs after the gradient, as its aux: in that order, which XLA schedules by, 9376 B
    where the aux first took 8800 B); aux=False drops them (`jax.grad(lambda *a: f(*a)[k])`)."""
    floats = [i for i, a in enumerate(closed.in_avals) if jnp.issubdtype(a.dtype, jnp.inexact)
              and (wrt is None or i in wrt)]
    diff = [i for i, a in enumerate(closed.out_avals) if jnp.issubdtype(a.dtype, jnp.inexact)   # (complex too:
            and (outs is None or i in outs)]     # its real part differentiated, a ones cotangent pulls it back)
    if not floats or not diff:
        return None
    memo = _TRACED_GRADIENTS.get()
    key = (id(closed), tuple(floats), tuple(diff), through_jit, with_value, outs is not None and aux)
    if memo is not None and key in memo:
        return memo[key][1]

    def grad(*args):
        def f(*fl):
            full = list(args)
            for i, v in zip(floats, fl):
                full[i] = v
            res = (jax.jit(functools.partial(_jax.eval_jaxpr, closed)) if through_jit else
                   functools.partial(_jax.eval_jaxpr, closed))(*full)
            return [res[i] for i in diff], [r for i, r in enumerate(res) if i not in diff]
        ys, pull, rest = jax.vjp(f, *[args[i] for i in floats], has_aux=True)
        grads = pull([jnp.ones_like(y) for y in ys])
        return (ys, rest, grads) if with_value else (grads, rest) if outs is not None and aux else grads

    try:
        out = jax.make_jaxpr(grad)(*[_jax.spec_of(a) for a in closed.in_avals])
    except Exception:  # noqa: BLE001 - not differentiable (integer loops, while loops): no grad view
        out = None
    if memo is not None:
        memo[key] = (closed, out)
    return out


def jvp_program(closed, wrt):
    """The jaxpr `jax.jvp` runs for this program, with tangents on the float inputs `wrt` (others held)."""
    wrt = [i for i in wrt if i < len(closed.in_avals) and jnp.issubdtype(closed.in_avals[i].dtype, jnp.inexact)]
    if not wrt:
        return closed
    specs = [_jax.spec_of(a) for a in closed.in_avals]

    def run(*x):
        def of(*d):
            full = list(x)
            for i, v in zip(wrt, d):
                full[i] = v
            return _jax.eval_jaxpr(closed, *full)
        return jax.jvp(of, tuple(x[i] for i in wrt), tuple(jnp.ones_like(x[i]) for i in wrt))
    try:
        return jax.make_jaxpr(run)(*specs)
    except Exception:  # noqa: BLE001 - a program JAX cannot run forward mode through here: judged as it is
        return closed


def batched_program(closed, axes, size: int):
    """The jaxpr `jax.vmap` runs for this program, inputs batched along `axes` (None: not batched); traced once
    per plan (`gradients_remembered`: a budget batches each candidate for every gradient it measures)."""
    memo = _TRACED_GRADIENTS.get()
    key = ("vmap", id(closed), tuple(axes), size)
    if memo is not None and key in memo:
        return memo[key][1]
    out = _batched_program(closed, axes, size)
    if memo is not None:
        memo[key] = (closed, out)
    return out


def _batched_program(closed, axes, size: int):
    specs = []
    for a, ax in zip(closed.in_avals, axes):
        shape = tuple(a.shape)
        if ax is not None:
            shape = shape[:ax] + (size,) + shape[ax:]
        specs.append(jax.ShapeDtypeStruct(shape, a.dtype))
    try:
        return jax.make_jaxpr(jax.vmap(lambda *x: _jax.eval_jaxpr(closed, *x), in_axes=list(axes)))(*specs)
    except Exception:  # noqa: BLE001 - a program JAX cannot batch here: judged unbatched
        return closed
