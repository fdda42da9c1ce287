"""remat_program: a byte budget for whole training steps (no loops). Plain vs optimize(memory=budget)
vs jax.checkpoint placed by hand per block vs checkpoint_dots.

(a) a 4-layer MLP (D=512, B=256) and (b) a small Flax transformer LM (4 blocks, d=128, 4 heads,
batch 8 x 128 tokens, vocabulary 256), each a train step `value_and_grad(loss)` + Adam update, jitted.
Budgets are 50% and 25% of the plain gradient's XLA temp memory (`jit(value_and_grad(loss))`:
a whole step's temp is smaller, as XLA parks activations in the new parameters' and Adam state's
output buffers); the loss is `optimize(loss, memory=budget)` (`jax.grad(optimize(f))`). Memory is
XLA's `memory_analysis().temp_size_in_bytes`; time is min-of-N wall time, the versions taking turns; "err" is the largest
difference of the loss and updated parameters from the plain step's.
(c) jax.grad through a data-dependent while loop (`max_steps`): gradient temp memory and time at three
trip counts and three bounds, against plain JAX's gradient of the same loop as a scan of its actual
length (which needs the trip count known in advance).
(d) a small ResNet (6 residual blocks of two 3x3 convolutions, 32 channels, GroupNorm, 32x32x3 images, batch
32) as (a)/(b), and the largest batch whose gradient fits 1 GiB of XLA temp memory, plain and optimized.
(b') --big: the transformer at issue 30's size (12 blocks, d=256, 8 heads, 4 x 256 tokens).
(e) --orders (issue 38): one table of both orders of a budget, `jax.grad(optimize(loss, memory=B))` and
`optimize(jax.value_and_grad(loss), memory=B)`, at 50%, 25% of the plain gradient's temp and "min", on seven
models (--models mlp,lm,resnet,gpt,unet,lstm,scanlm picks some): whether each meets its budget, what it
warns, and what its planning costs against a plain compile. --quick: the 50% budget only.
Run: .venv/bin/python benchmarks/memory_budget.py [--quick] [--while] [--resnet] [--batch] [--grad-first] [--big]
    [--orders [--models a,b,...]]
XLA:CPU before jaxlib 0.11 reuses no memory that recomputation frees unless its memory scheduler is on
(XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false; docs/remat.md): run on the newest JAX.
"""
import functools
import math
import os
import re
import sys
import tempfile
import time
import traceback
import warnings

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxform
from jaxform.inspect.program import min_time

QUICK = "--quick" in sys.argv
REPS = 3 if QUICK else 5
MiB = 2 ** 20
DOTS = jax.checkpoint_policies.dots_saveable


# ---- (a) MLP -------------------------------------------------------------------------------

def mlp_layer(h, W, b):
    h = jax.nn.gelu(h @ W + b)
    return h + 0.1 * jnp.tanh(h)


def mlp_loss(wrap):
    def loss(params, batch):
        x, y = batch
        h = x
        for W, b in params:
            h = wrap(mlp_layer)(h, W, b)
        return jnp.mean((h - y) ** 2)
    return loss


def mlp_setup(B=256):
    r = np.random.RandomState(0)
    D = 512
    params = [(jnp.asarray(r.randn(D, D) * 0.05, np.float32), jnp.zeros(D, np.float32)) for _ in range(4)]
    batch = (jnp.asarray(r.randn(B, D), np.float32), jnp.asarray(r.randn(B, D), np.float32))
    return params, batch, {"plain": mlp_loss(lambda f: f), "hand": mlp_loss(jax.checkpoint),
                           "dots": mlp_loss(lambda f: jax.checkpoint(f, policy=DOTS))}


# ---- (b) transformer LM --------------------------------------------------------------------

class Block(nn.Module):
    d: int
    heads: int

    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm()(x)
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        x = x + nn.SelfAttention(num_heads=self.heads, qkv_features=self.d)(h, mask=mask)
        h = nn.LayerNorm()(x)
        h = nn.Dense(4 * self.d)(h)
        return x + nn.Dense(self.d)(jax.nn.gelu(h))


class LM(nn.Module):
    vocab: int = 256
    d: int = 128
    heads: int = 4
    layers: int = 4
    policy: str = "plain"     # plain | hand (nn.remat per block) | dots (nn.remat per block, checkpoint_dots)

    @nn.compact
    def __call__(self, tokens):
        blk = {"plain": Block, "hand": nn.remat(Block), "dots": nn.remat(Block, policy=DOTS)}[self.policy]
        x = nn.Embed(self.vocab, self.d)(tokens) + self.param("pos", nn.initializers.normal(0.02),
                                                              (tokens.shape[1], self.d))
        for i in range(self.layers):
            x = blk(self.d, self.heads, name=f"block_{i}")(x)
        return nn.Dense(self.vocab)(nn.LayerNorm()(x))


def lm_setup(batch=8, big=False):
    """The small LM (4 blocks, d=128, 4 heads, 8 x 128 tokens); big: issue 30's (12 blocks, d=256, 8 heads,
    4 x 256 tokens: 514 MiB with `jax.jit` there)."""
    r = np.random.RandomState(0)
    size = dict(d=256, heads=8, layers=12) if big else {}
    tokens = jnp.asarray(r.randint(0, 256, (4 if big and batch == 8 else batch, 257 if big else 129)), np.int32)
    params = LM(**size).init(jax.random.PRNGKey(0), tokens[:, :-1])

    def loss_of(policy):
        model = LM(policy=policy, **size)

        def loss(params, tokens):
            logits = model.apply(params, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
        return loss
    return params, tokens, {k: loss_of(k) for k in ("plain", "hand", "dots")}


# ---- (d) a small ResNet (convolutions) -------------------------------------------------------

class ResBlock(nn.Module):
    ch: int

    @nn.compact
    def __call__(self, x):
        h = nn.Conv(self.ch, (3, 3))(jax.nn.relu(nn.GroupNorm(num_groups=8)(x)))
        h = nn.Conv(self.ch, (3, 3))(jax.nn.relu(nn.GroupNorm(num_groups=8)(h)))
        return x + h


class ResNet(nn.Module):
    ch: int = 32
    blocks: int = 6
    policy: str = "plain"

    @nn.compact
    def __call__(self, x):
        blk = {"plain": ResBlock, "hand": nn.remat(ResBlock), "dots": nn.remat(ResBlock, policy=DOTS)}[self.policy]
        x = nn.Conv(self.ch, (3, 3))(x)
        for i in range(self.blocks):
            x = blk(self.ch, name=f"block_{i}")(x)
        return nn.Dense(10)(jnp.mean(x, axis=(1, 2)))


def resnet_setup(batch=32):
    r = np.random.RandomState(0)
    images = jnp.asarray(r.randn(batch, 32, 32, 3), np.float32)
    labels = jnp.asarray(r.randint(0, 10, (batch,)), np.int32)
    params = ResNet().init(jax.random.PRNGKey(0), images[:1])

    def loss_of(policy):
        model = ResNet(policy=policy)

        def loss(params, batch):
            x, y = batch
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y).mean()
        return loss
    return params, (images, labels), {k: loss_of(k) for k in ("plain", "hand", "dots")}


def largest_batch(setup, limit=2 ** 30, grad_first=False):
    """The largest batch whose gradient fits `limit` bytes of XLA temp memory, plain and with
    `optimize(memory=limit)`: doubling, then bisection, compiling only (nothing runs)."""
    def fits(batch, opt):
        params, data, losses = setup(batch)
        loss = jaxform.optimize(losses["plain"], memory=limit) if opt else losses["plain"]
        with __import__("warnings").catch_warnings():
            __import__("warnings").simplefilter("ignore")
            return temp(jax.jit(jax.value_and_grad(loss)), params, data) <= limit
    out = []
    for opt in (False, True):
        lo, hi = 0, 16
        while fits(hi, opt):
            lo, hi = hi, hi * 2
        while hi - lo > max(1, lo // 16):          # to within 1/16
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid, opt) else (lo, mid)
        out.append(lo)
    return out


# ---- the train step ------------------------------------------------------------------------

OPT = optax.adam(1e-3)


def step_of(loss):
    def step(params, opt_state, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = OPT.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state
    return jax.jit(step)


def temp(f, *args):
    return f.lower(*args).compile().memory_analysis().temp_size_in_bytes


def grad_err(loss, ref_loss, params, batch):
    """Largest gradient difference, relative to the largest gradient entry (Adam's first step divides a
    gradient by its own size, so `err` of the updated parameters shows rounding of tiny entries)."""
    g, r = (jax.tree_util.tree_leaves(jax.jit(jax.grad(f))(params, batch)) for f in (loss, ref_loss))
    scale = max(float(jnp.max(jnp.abs(x))) for x in r)
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(g, r)) / scale


def err(a, b):
    return max(float(jnp.max(jnp.abs(jnp.asarray(x, jnp.float32) - jnp.asarray(y, jnp.float32))))
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def run(name, setup):
    params, batch, losses = setup()
    opt_state = OPT.init(params)
    args = (params, opt_state, batch)
    grad_temp = lambda loss: temp(jax.jit(jax.value_and_grad(loss)), params, batch)   # noqa: E731
    base = grad_temp(losses["plain"])
    rows = [("plain", losses["plain"], None)]
    for frac in (0.5, 0.25):
        budget = int(base * frac)
        t0 = time.perf_counter()
        f = jaxform.optimize(losses["plain"], memory=budget)
        jax.block_until_ready(jax.jit(jax.grad(f))(params, batch))
        rows.append((f"optimize(memory={frac:.0%} = {budget / MiB:.2f} MiB)", f, (budget, time.perf_counter() - t0)))
    rows += [("jax.checkpoint per block (hand)", losses["hand"], None),
             ("checkpoint_dots per block", losses["dots"], None)]
    steps = [step_of(r[1]) for r in rows]
    times = min_time(steps, args, REPS)
    ref = steps[0](*args)
    print(f"\n({name}) value_and_grad XLA temp (plain {base / MiB:.2f} MiB); train step (+ Adam) temp and time")
    print(f"{'version':40s} {'grad MiB':>9s} {'of plain':>8s} {'step MiB':>9s} {'step ms':>8s} {'x plain':>8s} "
          f"{'err':>9s} {'grad err':>9s}  budget")
    for (label, loss, extra), s, t in zip(rows, steps, times):
        m = grad_temp(loss)
        e = err(s(*args)[:2], ref[:2])
        note = "" if extra is None else (f"{'fits' if m <= extra[0] else 'OVER'} (plan+compile {extra[1]:.1f} s)")
        print(f"{label:40s} {m / MiB:9.2f} {m / base:8.0%} {temp(s, *args) / MiB:9.2f} {t * 1e3:8.1f} "
              f"{t / times[0]:8.2f} {e:9.2e} {grad_err(loss, losses['plain'], params, batch):9.1e}  {note}")


def run_grad_first(name, setup):
    """The other order, `optimize(jax.value_and_grad(loss), memory=budget)`: recomputation placed in the
    already differentiated program (`passes/recompute.py`); memory is that program's own XLA temp."""
    params, batch, losses = setup()
    opt_state = OPT.init(params)
    args = (params, opt_state, batch)
    vg = jax.value_and_grad(losses["plain"])
    base = temp(jax.jit(vg), params, batch)
    rows = [("plain", vg, None)]
    for frac in (0.5, 0.25):
        budget = int(base * frac)
        t0 = time.perf_counter()
        with __import__("warnings").catch_warnings():
            __import__("warnings").simplefilter("ignore")
            f = jaxform.optimize(vg, memory=budget)
            jax.block_until_ready(jax.jit(f)(params, batch))
        rows.append((f"optimize(vg, memory={frac:.0%} = {budget / MiB:.2f} MiB)", f, (budget, time.perf_counter() - t0)))
    rows.append(("jax.checkpoint per block (hand)", jax.value_and_grad(losses["hand"]), None))

    def step_with(vgf):
        def step(params, opt_state, batch):
            value, grads = vgf(params, batch)
            updates, opt_state = OPT.update(grads, opt_state, params)
            return value, optax.apply_updates(params, updates), opt_state
        return jax.jit(step)
    steps = [step_with(r[1]) for r in rows]
    times = min_time(steps, args, REPS)
    ref = steps[0](*args)
    print(f"\n({name}) optimize(jax.value_and_grad(loss), memory=...): its XLA temp (plain {base / MiB:.2f} MiB); "
          f"train step time")
    print(f"{'version':40s} {'vg MiB':>9s} {'of plain':>8s} {'step ms':>8s} {'x plain':>8s} {'err':>9s}  budget")
    for (label, f, extra), s, t in zip(rows, steps, times):
        m = temp(jax.jit(f), params, batch)
        e = err(s(*args)[:2], ref[:2])
        note = "" if extra is None else (f"{'fits' if m <= extra[0] else 'OVER'} (plan+compile {extra[1]:.1f} s)")
        print(f"{label:40s} {m / MiB:9.2f} {m / base:8.0%} {t * 1e3:8.1f} {t / times[0]:8.2f} {e:9.2e}  {note}")


# ---- (c) grad through a while loop --------------------------------------------------------

def while_fixed_point(W, tol):
    """x <- tanh(sin(x) @ W + b) until the step is under tol (a data-dependent trip count)."""
    def f(b):
        def body(c):
            i, x, _ = c
            x2 = jnp.tanh(jnp.sin(x) @ W + b)
            return i + 1, x2, jnp.max(jnp.abs(x2 - x))
        _, x, _ = jax.lax.while_loop(lambda c: c[2] > tol, body, (0, jnp.zeros_like(b), jnp.float32(1.0)))
        return jnp.sum(x ** 2)
    return f


def run_while():
    r = np.random.RandomState(0)
    b = jnp.asarray(r.randn(64, 256), np.float32)
    print("\n(c) jax.grad through a while_loop (fixed point x <- tanh(sin(x) @ W + b), carry 64x256 f32 = 64 KiB)")
    print(f"{'W scale':>8s} {'trips':>6s} {'max_steps':>9s} {'grad MiB':>9s} {'ms':>8s}   scan of the actual length: "
          f"{'MiB':>7s} {'ms':>7s}  err")
    for scale, bound in ((0.05, 1000), (0.08, 1000), (0.09, 1000), (0.08, 100), (0.08, 10000)):
        W = jnp.asarray(np.random.RandomState(1).randn(256, 256) * scale, np.float32)
        f = while_fixed_point(W, 1e-5)

        def counted(b):
            def body(c):
                i, x, _ = c
                x2 = jnp.tanh(jnp.sin(x) @ W + b)
                return i + 1, x2, jnp.max(jnp.abs(x2 - x))
            return jax.lax.while_loop(lambda c: c[2] > 1e-5, body, (0, jnp.zeros_like(b), jnp.float32(1.0)))[0]
        n = int(jax.jit(counted)(b))
        if n > bound:
            continue

        def scan_f(b):
            x = jax.lax.scan(lambda x, _: (jnp.tanh(jnp.sin(x) @ W + b), None), jnp.zeros_like(b), None, length=n)[0]
            return jnp.sum(x ** 2)
        ours = jax.jit(jax.grad(jaxform.optimize(f, memory="min", max_steps=bound)))
        ref = jax.jit(jax.grad(scan_f))
        t = min_time([ours, ref], (b,), REPS)
        e = float(jnp.max(jnp.abs(ours(b) - ref(b))))
        print(f"{scale:8.2f} {n:6d} {bound:9d} {temp(ours, b) / MiB:9.2f} {t[0] * 1e3:8.1f}   "
              f"{'':26s} {temp(ref, b) / MiB:7.2f} {t[1] * 1e3:7.1f}  {e:.1e}")


# ---- (e) --orders: both orders of a budget, on seven models (issue 38) ------------------------
# The three models above, and four more of the shapes users bring: a GPT in Equinox, a diffusion U-Net,
# an LSTM whose time loop is a scan, and a transformer whose blocks are one `nn.scan`.

class GPTAttention(eqx.Module):
    """nanoGPT's CausalSelfAttention, attention written out (q k^T, causal mask, softmax, @ v) as
    karpathy/nanoGPT model.py does without flash attention; one sequence (T, d), vmapped over the batch."""
    c_attn: eqx.nn.Linear
    c_proj: eqx.nn.Linear
    n_head: int = eqx.field(static=True)

    def __init__(self, d, n_head, key):
        k1, k2 = jax.random.split(key)
        self.c_attn, self.c_proj, self.n_head = eqx.nn.Linear(d, 3 * d, key=k1), eqx.nn.Linear(d, d, key=k2), n_head

    def __call__(self, x):
        T, d = x.shape
        q, k, v = (a.reshape(T, self.n_head, d // self.n_head).transpose(1, 0, 2)
                   for a in jnp.split(jax.vmap(self.c_attn)(x), 3, axis=-1))
        att = q @ k.transpose(0, 2, 1) / math.sqrt(d // self.n_head)
        att = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((T, T), bool)), att, -jnp.inf), axis=-1)
        return jax.vmap(self.c_proj)((att @ v).transpose(1, 0, 2).reshape(T, d))


class GPTBlock(eqx.Module):
    ln_1: eqx.nn.LayerNorm
    attn: GPTAttention
    ln_2: eqx.nn.LayerNorm
    c_fc: eqx.nn.Linear
    c_proj: eqx.nn.Linear

    def __init__(self, d, n_head, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.ln_1, self.ln_2 = eqx.nn.LayerNorm(d), eqx.nn.LayerNorm(d)
        self.attn = GPTAttention(d, n_head, k1)
        self.c_fc, self.c_proj = eqx.nn.Linear(d, 4 * d, key=k2), eqx.nn.Linear(4 * d, d, key=k3)

    def __call__(self, x):
        x = x + self.attn(jax.vmap(self.ln_1)(x))
        h = jax.vmap(self.c_fc)(jax.vmap(self.ln_2)(x))
        return x + jax.vmap(self.c_proj)(jax.nn.gelu(h))


class GPT(eqx.Module):
    """karpathy/nanoGPT's GPT (https://github.com/karpathy/nanoGPT/blob/master/model.py: wte + wpe, pre-LN
    blocks, ln_f, lm_head tied to wte), ported to Equinox here (no dropout; biases kept, nanoGPT's bias=True)."""
    wte: eqx.nn.Embedding
    wpe: eqx.nn.Embedding
    h: list
    ln_f: eqx.nn.LayerNorm

    def __init__(self, vocab=256, block=128, d=128, n_head=4, n_layer=4, seed=0):
        keys = jax.random.split(jax.random.PRNGKey(seed), n_layer + 2)
        self.wte, self.wpe = (eqx.nn.Embedding(weight=0.02 * jax.random.normal(k, (n, d)))   # nanoGPT's init
                              for k, n in ((keys[0], vocab), (keys[1], block)))
        self.h = [GPTBlock(d, n_head, k) for k in keys[2:]]
        self.ln_f = eqx.nn.LayerNorm(d)

    def __call__(self, idx):
        x = self.wte.weight[idx] + self.wpe.weight[jnp.arange(idx.shape[0])]
        for blk in self.h:
            x = blk(x)
        return jax.vmap(self.ln_f)(x) @ self.wte.weight.T


def gpt_setup(batch=8):
    """4 layers, d=128, 4 heads, block 128, vocabulary 256; params are the model's arrays (`eqx.partition`)."""
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 256, (batch, 129)), np.int32)
    params, static = eqx.partition(GPT(), eqx.is_array)

    def loss(params, tokens):
        logits = jax.vmap(eqx.combine(params, static))(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    return params, tokens, {"plain": loss}


def timestep_embedding(t, dim):
    """DDPM's sinusoidal embedding of the diffusion step."""
    freqs = jnp.exp(-math.log(10000.0) * jnp.arange(dim // 2) / (dim // 2 - 1))
    args = t.astype(jnp.float32)[:, None] * freqs[None]
    return jnp.concatenate([jnp.sin(args), jnp.cos(args)], axis=1)


class UNetBlock(nn.Module):
    """DDPM's ResnetBlock: GroupNorm, swish, 3x3 conv, + the projected time embedding, again; a 1x1 conv
    on the skip where the channels change."""
    ch: int

    @nn.compact
    def __call__(self, x, temb):
        h = nn.Conv(self.ch, (3, 3))(nn.swish(nn.GroupNorm(num_groups=8)(x)))
        h = h + nn.Dense(self.ch)(nn.swish(temb))[:, None, None, :]
        h = nn.Conv(self.ch, (3, 3))(nn.swish(nn.GroupNorm(num_groups=8)(h)))
        return (x if x.shape[-1] == self.ch else nn.Conv(self.ch, (1, 1))(x)) + h


class UNet(nn.Module):
    """A small DDPM U-Net after yang-song/score_sde models/ddpm.py (the Flax port of hojonathanho/diffusion
    diffusion_tf/models/unet.py): one residual block per level, channels 32/64, two strided-conv downsamplings,
    two nearest-neighbour upsamplings, skips concatenated, no attention."""
    chs: tuple = (32, 64)

    @nn.compact
    def __call__(self, x, t):
        temb = nn.Dense(4 * self.chs[0])(timestep_embedding(t, self.chs[0]))
        temb = nn.Dense(4 * self.chs[0])(nn.swish(temb))
        h = nn.Conv(self.chs[0], (3, 3))(x)
        hs = []
        for ch in self.chs:                                   # down: 32x32 -> 16x16 -> 8x8
            h = UNetBlock(ch)(h, temb)
            hs.append(h)
            h = nn.Conv(ch, (3, 3), strides=(2, 2))(h)
        h = UNetBlock(self.chs[-1])(h, temb)
        for ch in reversed(self.chs):                         # up: 8x8 -> 16x16 -> 32x32
            n, hh, ww, c = h.shape
            h = nn.Conv(ch, (3, 3))(jax.image.resize(h, (n, 2 * hh, 2 * ww, c), "nearest"))
            h = UNetBlock(ch)(jnp.concatenate([h, hs.pop()], axis=-1), temb)
        return nn.Conv(x.shape[-1], (3, 3))(nn.swish(nn.GroupNorm(num_groups=8)(h)))


def unet_setup(batch=8):
    """Loss: the MSE of the predicted noise at random steps of a linear 1000-step beta schedule."""
    r = np.random.RandomState(0)
    x0, noise = (jnp.asarray(r.randn(batch, 32, 32, 3), np.float32) for _ in range(2))
    t = jnp.asarray(r.randint(0, 1000, (batch,)), np.int32)
    abar = jnp.asarray(np.cumprod(1 - np.linspace(1e-4, 0.02, 1000)), np.float32)
    model = UNet()
    params = model.init(jax.random.PRNGKey(0), x0[:1], t[:1])

    def loss(params, batch):
        x0, noise, t = batch
        a = abar[t][:, None, None, None]
        return jnp.mean((model.apply(params, jnp.sqrt(a) * x0 + jnp.sqrt(1 - a) * noise, t) - noise) ** 2)
    return params, (x0, noise, t), {"plain": loss}


class LSTMLM(nn.Module):
    """google/init2winit's LSTM language model (init2winit/model_lib/lstm_lm.py WrappedLSTM: embed, stacked
    LSTM layers each a scan over time, Dense to the vocabulary), without dropout; nn.RNN is Flax's nn.scan
    of the cell."""
    vocab: int = 256
    hidden: int = 256
    layers: int = 2

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.hidden)(tokens)
        for i in range(self.layers):
            x = nn.RNN(nn.LSTMCell(self.hidden), name=f"lstm_{i}")(x)
        return nn.Dense(self.vocab)(x)


def lstm_setup(batch=16):
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 256, (batch, 129)), np.int32)
    model = LSTMLM()
    params = model.init(jax.random.PRNGKey(0), tokens[:, :-1])

    def loss(params, tokens):
        logits = model.apply(params, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    return params, tokens, {"plain": loss}


class ScanBlock(nn.Module):
    """(b)'s Block in nn.scan's (carry, x) -> (carry, y) form."""
    d: int
    heads: int

    @nn.compact
    def __call__(self, x, _):
        return Block(self.d, self.heads)(x), None


class ScanLM(nn.Module):
    """(b)'s LM with its blocks one `nn.scan` (stacked parameters, one loop), as Flax's examples and
    MaxText-style models write deep transformers."""
    vocab: int = 256
    d: int = 128
    heads: int = 4
    layers: int = 4

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.d)(tokens) + self.param("pos", nn.initializers.normal(0.02),
                                                              (tokens.shape[1], self.d))
        blocks = nn.scan(ScanBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=self.layers)
        x, _ = blocks(self.d, self.heads, name="blocks")(x, None)
        return nn.Dense(self.vocab)(nn.LayerNorm()(x))


def scanlm_setup(batch=8):
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 256, (batch, 129)), np.int32)
    model = ScanLM()
    params = model.init(jax.random.PRNGKey(0), tokens[:, :-1])

    def loss(params, tokens):
        logits = model.apply(params, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    return params, tokens, {"plain": loss}


MODELS = {"mlp": mlp_setup, "lm": lm_setup, "resnet": resnet_setup, "gpt": gpt_setup, "unet": unet_setup,
          "lstm": lstm_setup, "scanlm": scanlm_setup}
# what a warning must say to name the other order: A's other is optimize(grad), B's is grad(optimize)
OTHER_ORDER = {"A": re.compile(r"optimize\((jax\.)?(value_and_)?grad"), "B": re.compile(r"grad\(optimize")}
ERRORS = []                 # (order, budget, the traceback's last lines), printed under the table


def compile_order(order, loss, budget, params, batch):
    """One order's first lower + compile, timed (jaxform plans while tracing, so this includes the plan):
    (temp bytes or None, seconds, jaxform warnings, error text or None)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        try:
            f = (jax.value_and_grad(jaxform.optimize(loss, memory=budget)) if order == "A"
                 else jaxform.optimize(jax.value_and_grad(loss), memory=budget))
            m = jax.jit(f).lower(params, batch).compile().memory_analysis().temp_size_in_bytes
            error = None
        except Exception as e:                              # noqa: BLE001: reported in the table, run goes on
            m, error = None, f"{type(e).__name__}: {e}"
            ERRORS.append((order, budget, "".join(traceback.format_exc().splitlines(True)[-6:])))
        seconds = time.perf_counter() - t0
    said = [str(w.message) for w in caught if "jaxform" in str(w.message)]
    return m, seconds, said, error


def run_orders(names):
    """Both orders per model and budget, one table. Budgets are bytes of the plain `jit(value_and_grad)`
    temp; "min" has no bytes to meet, so its fits column is "-". Warning texts are listed under the table."""
    budgets = [("50%", 0.5)] + ([] if QUICK else [("25%", 0.25), ("min", None)])
    notes = []
    print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print("\n(e) both orders: A = jit(value_and_grad(optimize(loss, memory=B))), "
          "B = jit(optimize(value_and_grad(loss), memory=B)); XLA temp MiB, of plain, budget met, warning "
          "(w<n>: listed below; '+': it names the other order), plan+compile s and x plain compile")
    head = (f"{'model':7s} {'budget':>13s} {'plain MiB':>9s} {'plain s':>7s} | "
            f"{'A MiB':>7s} {'of pl':>5s} {'fits':>4s} {'warn':>5s} {'A s':>6s} {'x':>5s} | "
            f"{'B MiB':>7s} {'of pl':>5s} {'fits':>4s} {'warn':>5s} {'B s':>6s} {'x':>5s} | {'within10%':>9s} "
            f"{'worse names better':>18s}")
    print(head)
    print("-" * len(head))
    for name in names:
        try:
            params, batch, losses = MODELS[name]()
            t0 = time.perf_counter()
            base = jax.jit(jax.value_and_grad(losses["plain"])).lower(params, batch).compile() \
                .memory_analysis().temp_size_in_bytes
            plain_s = time.perf_counter() - t0
        except Exception as e:                              # noqa: BLE001
            print(f"{name:7s} plain failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        for label, frac in budgets:
            budget = "min" if frac is None else int(base * frac)
            cells, got = [], {}
            for order in ("A", "B"):
                m, s, said, error = compile_order(order, losses["plain"], budget, params, batch)
                if error is not None:
                    cells.append(f"ERROR {error[:100]}")
                    continue
                got[order] = (m, said)
                w = "no"
                if said:
                    notes.append(said[0][:200])
                    w = f"w{len(notes)}" + ("+" if any(OTHER_ORDER[order].search(x) for x in said) else "")
                fits = "-" if frac is None else "fits" if m <= budget else "OVER"
                cells.append(f"{m / MiB:7.2f} {m / base:5.0%} {fits:>4s} {w:>5s} {s:6.1f} {s / plain_s:5.1f}")
            within, names_better = "-", "-"
            if len(got) == 2:
                (ma, _), (mb, _) = got["A"], got["B"]
                within = "yes" if min(ma, mb) >= 0.9 * max(ma, mb) else "no"
                if within == "no":
                    worse = "A" if ma > mb else "B"
                    names_better = "yes" if any(OTHER_ORDER[worse].search(x) for x in got[worse][1]) else "no"
            blabel = label if frac is None else f"{label} {budget / MiB:.2f}M"
            print(f"{name:7s} {blabel:>13s} {base / MiB:9.2f} {plain_s:7.1f} | {cells[0]} | {cells[1]} | "
                  f"{within:>9s} {names_better:>18s}", flush=True)
    for i, n in enumerate(notes, 1):
        print(f"w{i}: {n}")
    for order, budget, tb in ERRORS:
        print(f"error, order {order}, memory={budget}:\n{tb}")


if __name__ == "__main__":
    print(f"jax {jax.__version__}, {jax.default_backend()}")
    if "--orders" in sys.argv:
        # planning timed cold, as a first run on a machine pays it: jaxform's measurements cache on disk
        os.environ.setdefault("JAXFORM_TUNE_CACHE", tempfile.mkdtemp(prefix="jaxform-orders-"))
        pick = sys.argv[sys.argv.index("--models") + 1].split(",") if "--models" in sys.argv else list(MODELS)
        run_orders(pick)
        sys.exit()
    if "--resnet" in sys.argv:
        run("d", resnet_setup)
    if "--big" in sys.argv:
        run("b, issue 30's size", functools.partial(lm_setup, big=True))
        sys.exit()
    if "--batch" in sys.argv or "--resnet" in sys.argv:
        for name, setup in (("MLP", mlp_setup), ("ResNet", resnet_setup), ("transformer LM", lm_setup)):
            plain, ours = largest_batch(setup)
            print(f"largest {name} batch whose gradient fits 1 GiB of XLA temp: plain {plain}, "
                  f"optimize(memory=1 GiB) {ours} ({ours / max(plain, 1):.2f}x)", flush=True)
        sys.exit()
    if "--grad-first" in sys.argv:
        for name, setup in (("a", mlp_setup), ("b", lm_setup), ("d", resnet_setup)):
            run_grad_first(name, setup)
        sys.exit()
    if "--while" not in sys.argv:
        run("a", mlp_setup)
        run("b", lm_setup)
        run("d", resnet_setup)
    run_while()
