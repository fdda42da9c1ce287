"""Ops that hold inner graphs: OpFromGraph (inlined node by node) and Scan (a `lax.scan` over the
converted inner graph; gradient scans go to the fallback).
"""
from __future__ import annotations

from ...ir.build import Var
from .registry import ConversionError, _NoConverter, _where, register
from .walk import _jax_funcify


def _ofg_has_own_jax(cls) -> bool:
    from pytensor.compile.builders import OpFromGraph
    jf = _jax_funcify()
    return jf.dispatch(cls) is not jf.dispatch(OpFromGraph)


def _register_scan():
    from pytensor.compile.builders import OpFromGraph
    from pytensor.scan.op import Scan
    from pytensor.tensor.type_other import MakeSlice

    @register(OpFromGraph)
    def op_from_graph(cv, node, *ins):
        """Inline the inner graph, converted node by node (XLogY, LogAddExp, KroneckerProduct, a user's
        OpFromGraph): its ops become plain primitives instead of one traced jax_funcify call. Subclasses that
        PyTensor's JAX backend implements on their own (Einsum, RandomVariableWithCoreShape) keep that."""
        if _ofg_has_own_jax(type(node.op)):
            raise _NoConverter
        icv = type(cv)(cv.b, cv.checks)
        for var, v in zip(node.op.fgraph.inputs, ins):
            icv.env[var] = v
        for nd in node.op.fgraph.toposort():
            icv.convert(nd)
        cv.direct += icv.direct
        cv.fallback += icv.fallback
        cv.folded += icv.folded
        cv.fallback_ops += icv.fallback_ops
        return [icv.get(o) for o in node.op.fgraph.outputs]

    register(MakeSlice)(lambda cv, node, *parts: slice(*parts))

    @register(Scan)
    def scan(cv, node, *ins):
        """A PyTensor Scan → one lax.scan whose body is the inner graph, converted node by node.

        Carries: mit-sot windows (the last -min(tap) values), sit-sot values, untraced sit-sots;
        xs: the sequences; ys: mit-sot, sit-sot and nit-sot traces, cut to PyTensor's buffer sizes.
        """
        op, b = node.op, cv.b
        info = op.info
        if info.as_while:
            raise ConversionError(f"jaxform: {_where(node)} is a while-scan (`until=`): the length of its results "
                                  "depends on the data, and a JAX program needs static shapes (PyTensor's JAX "
                                  "backend refuses it too). Write the loop with a fixed n_steps, masking the steps "
                                  "after the condition holds.")
        if info.n_mit_mot:
            raise _NoConverter  # gradient scans of pytensor.grad (mit-mot): PyTensor's JAX code, a counted fallback
        n = int(cv.static(ins[0], node, "the number of steps"))
        head = lambda x, k: b.slice(x, [0] * x.ndim, [k] + list(x.shape[1:]))
        at = lambda x, i: b.reshape(b.slice(x, [i] + [0] * (x.ndim - 1), [i + 1] + list(x.shape[1:])), x.shape[1:])
        seqs = [cv.value(x) for x in op.outer_seqs(list(ins))]
        seqs = [x if x.shape[0] == n else head(x, n) for x in seqs]
        taps = [list(t) for t in info.mit_sot_in_slices]
        mit_bufs = [cv.value(x) for x in op.outer_mitsot(list(ins))]
        windows = [head(x, -min(t)) for x, t in zip(mit_bufs, taps)]
        sit_bufs = [cv.value(x) for x in op.outer_sitsot(list(ins))]
        sits = [at(x, 0) for x in sit_bufs]
        untraced = [cv.value(x) for x in op.outer_untraced_sit_sot(list(ins))]
        nonseqs = list(op.outer_non_seqs(list(ins)))
        dyn = [x for x in nonseqs if isinstance(x, Var)]
        nw, ns, nu = len(windows), len(sits), len(untraced)

        def body(sb, *args):
            consts, carry, xs = args[:len(dyn)], args[len(dyn):len(args) - len(seqs)], args[len(args) - len(seqs):]
            wins, cur, unt = carry[:nw], carry[nw:nw + ns], carry[nw + ns:]
            icv = type(cv)(sb, cv.checks)
            vals = list(xs)
            for w, t in zip(wins, taps):
                vals += [sb.reshape(sb.slice(w, [-min(t) + k] + [0] * (w.ndim - 1),
                                             [-min(t) + k + 1] + list(w.shape[1:])), w.shape[1:]) for k in t]
            it = iter(consts)
            vals += list(cur) + list(unt) + [next(it) if isinstance(x, Var) else x for x in nonseqs]
            for var, v in zip(op.fgraph.inputs, vals):
                icv.env[var] = v
            for nd in op.fgraph.toposort():
                icv.convert(nd)
            outs = [icv.get(o) for o in op.fgraph.outputs]
            cv.direct += icv.direct
            cv.fallback += icv.fallback
            cv.folded += icv.folded
            cv.fallback_ops += icv.fallback_ops
            fit = lambda v, like: sb.broadcast_to(icv.value(v, like.dtype), tuple(like.shape))
            mit_new = [sb.broadcast_to(icv.value(v, w.dtype), tuple(w.shape[1:]))
                       for v, w in zip(op.inner_mitsot_outs(outs), wins)]
            sit_new = [fit(v, c) for v, c in zip(op.inner_sitsot_outs(outs), cur)]
            unt_new = [fit(v, u) for v, u in zip(op.inner_untraced_sit_sot_outs(outs), unt)]
            nit_new = [icv.value(v, o.type.dtype) for v, o in zip(op.inner_nitsot_outs(outs),
                                                                  op.inner_nitsot_outs(op.fgraph.outputs))]
            new_wins = [sb.concatenate([sb.slice(w, [1] + [0] * (w.ndim - 1), list(w.shape)),
                                        sb.reshape(v, (1,) + tuple(v.shape))], 0) for w, v in zip(wins, mit_new)]
            return new_wins + sit_new + unt_new + mit_new + sit_new + nit_new

        carry, ys = b.scan(body, dyn, windows + sits + untraced, seqs, length=n)
        final_unt = carry[nw + ns:]
        traces = []
        inits = windows + [b.reshape(s, (1,) + tuple(s.shape)) for s in sits]
        sizes = [x.shape[0] for x in mit_bufs + sit_bufs] + \
            [int(cv.static(x, node, "a nit-sot length")) for x in op.outer_nitsot(list(ins))]
        for k, (tr, size) in enumerate(zip(ys, sizes)):
            if tr.shape[0] > size:
                tr = b.slice(tr, [tr.shape[0] - size] + [0] * (tr.ndim - 1), list(tr.shape))
            elif tr.shape[0] < size:
                init = inits[k]
                need = size - tr.shape[0]
                init = b.slice(init, [init.shape[0] - need] + [0] * (init.ndim - 1), list(init.shape))
                tr = b.concatenate([init, tr], 0)
            traces.append(tr)
        return traces + final_unt
