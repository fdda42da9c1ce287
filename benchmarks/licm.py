"""hoist_loop_invariants: original vs optimized vs hand-hoisted loops, in one run.

For each case prints the nodes inside loop bodies before/after the pass,
compiled runtime (min of N after warmup) of the original (`jax.jit(f)`),
ours (`jax.jit(optimize(f, passes=["hoist_loop_invariants"]))`) and a
hand-hoisted version, XLA temp memory, and the ratios. XLA runs its own
while-loop invariant code motion, so "orig / ours" near 1.0 means XLA had
already done it; the pass must never be slower beyond noise.
Run: .venv/bin/python benchmarks/licm.py [--quick]
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxform
from jaxform.inspect.program import min_time
from jaxform.ir import Graph

QUICK = "--quick" in sys.argv
T, H, REPS = (100, 64, 3) if QUICK else (1000, 128, 7)
R = np.random.RandomState(0)
W = jnp.asarray(R.randn(H, H).astype(np.float32) / np.sqrt(H))
X = jnp.asarray(R.randn(H).astype(np.float32))
A = jnp.asarray((R.randn(H, H) / H + 4 * np.eye(H)).astype(np.float32))   # diagonally dominant
B = jnp.asarray(R.randn(H).astype(np.float32))


# -- 1. W @ W.T inside a T-step scan -------------------------------------------------
def gram(W, x):
    return lax.scan(lambda c, _: (jnp.tanh((W @ W.T) @ c), None), x, None, length=T)[0]


def gram_hand(W, x):
    G = W @ W.T
    return lax.scan(lambda c, _: (jnp.tanh(G @ c), None), x, None, length=T)[0]


# -- 2. a matrix inverse inside a T-step scan ------------------------------------------
def inverse(W, x):
    return lax.scan(lambda c, _: (jnp.tanh(jnp.linalg.inv(W + 4 * jnp.eye(H)) @ c), None), x, None, length=T)[0]


def inverse_hand(W, x):
    Ai = jnp.linalg.inv(W + 4 * jnp.eye(H))
    return lax.scan(lambda c, _: (jnp.tanh(Ai @ c), None), x, None, length=T)[0]


# -- 3. Jacobi solver (fori_loop, dynamic trip count -> while) with invariant preprocessing ----
def jacobi(A, b, n):
    def body(i, x):
        d = jnp.diag(A)
        R_ = A - jnp.diag(d)
        return (b - R_ @ x) / d
    return lax.fori_loop(0, n, body, jnp.zeros_like(b))


def jacobi_hand(A, b, n):
    d = jnp.diag(A)
    R_ = A - jnp.diag(d)
    return lax.fori_loop(0, n, lambda i, x: (b - R_ @ x) / d, jnp.zeros_like(b))


# -- 4. grad of a checkpointed scan: the transposed scan recomputes W @ W.T per step ----------
def ck_loss(W, x):
    body = jax.checkpoint(lambda c, _: (jnp.tanh((W @ W.T) @ c), None))
    return jnp.sum(lax.scan(body, x, None, length=T)[0] ** 2)


def ck_loss_hand(W, x):
    G = W @ W.T
    body = jax.checkpoint(lambda c, G: (jnp.tanh(G @ c), None))
    return jnp.sum(lax.scan(lambda c, _: body(c, G), x, None, length=T)[0] ** 2)


# -- 5. grad of a plain scan (JAX's partial eval already hoists the forward residual) ---------
def plain_loss(W, x):
    return jnp.sum(gram(W, x) ** 2)


# -- 6. work shared by both branches of a cond in a scan body ---------------------------------
def cond_shared(W, x):
    def body(c, i):
        return lax.cond(i % 2 == 0, lambda: jnp.tanh(jnp.exp(W) @ c), lambda: jnp.sin(jnp.exp(W) @ c)), None
    return lax.scan(body, x, jnp.arange(T))[0]


def cond_shared_hand(W, x):
    E = jnp.exp(W)
    def body(c, i):
        return lax.cond(i % 2 == 0, lambda: jnp.tanh(E @ c), lambda: jnp.sin(E @ c)), None
    return lax.scan(body, x, jnp.arange(T))[0]


CASES = [
    ("scan: W @ W.T in body", gram, gram_hand, (W, X)),
    ("scan: inv(W) in body", inverse, inverse_hand, (W, X)),
    ("fori (while): Jacobi prep", jacobi, jacobi_hand, (A, B, T)),
    ("grad scan(checkpoint(body))", jax.grad(ck_loss), jax.grad(ck_loss_hand), (W, X)),
    ("grad scan(body)", jax.grad(plain_loss), None, (W, X)),
    ("scan: cond, shared work", cond_shared, cond_shared_hand, (W, X)),
]


def in_loops(g: Graph, depth: int = 0) -> int:
    return sum((depth > 0) + sum(in_loops(s, depth + (n.name in ("scan", "while"))) for s in n.subgraphs())
               for n in g.nodes)


def temp(f, args):
    return f.lower(*args).compile().memory_analysis().temp_size_in_bytes


def main():
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, T={T}, H={H}, min of {REPS}")
    print(f"{'case':30s} {'body nodes':>11s} {'orig ms':>9s} {'ours ms':>9s} {'hand ms':>9s} "
          f"{'orig/ours':>9s} {'hand/ours':>9s} {'temp orig/ours KiB':>19s}")
    for name, f, hand, args in CASES:
        ours = jaxform.optimize(f, passes=["hoist_loop_invariants"], strict=True)
        before = in_loops(Graph.from_jaxpr(jax.make_jaxpr(f)(*args)))
        after = in_loops(jaxform.trace(ours, *args))
        jf, jo = jax.jit(f), jax.jit(ours)
        np.testing.assert_allclose(jf(*args), jo(*args), rtol=2e-4, atol=2e-4)
        to, tu, th = min_time([jf, jo, jax.jit(hand) if hand else jf], args, REPS)
        th = th if hand else float("nan")
        same = str(jax.make_jaxpr(f)(*args)) == str(jax.make_jaxpr(ours)(*args))
        print(f"{name:30s} {before:5d} ->{after:3d} {to * 1e3:9.2f} {tu * 1e3:9.2f} {th * 1e3:9.2f} "
              f"{to / tu:9.2f} {th / tu:9.2f} {temp(jf, args) / 1024:9.0f}/{temp(jo, args) / 1024:<9.0f}"
              + ("  (pass left the program unchanged)" if same else ""))


if __name__ == "__main__":
    main()
