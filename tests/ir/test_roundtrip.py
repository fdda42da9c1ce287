"""Round trip jaxpr -> Graph -> jaxpr, and optimize == original, over the corpus."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxform
from jaxform import _jax
from jaxform.ir import Graph, format_graph
from jaxform.testing import assert_same

from corpus import PROGRAMS

IDS = [p[0] for p in PROGRAMS]


def test_corpus_is_broad():
    assert len(PROGRAMS) >= 40
    prims = set()
    for _, fn, args, _ in PROGRAMS:
        prims |= {n.name for n, _ in Graph.from_jaxpr(jax.make_jaxpr(fn)(*args)).walk()}
    for family in ["scan", "cond", "while", "jit", "custom_jvp_call", "custom_vjp_call", "remat2",
                   "shard_map", "new_ref", "get", "swap", "gather", "scatter-add", "dot_general"]:
        assert family in prims, family


def _bits_equal(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name,fn,args,diff", PROGRAMS, ids=IDS)
def test_round_trip(name, fn, args, diff):
    closed = jax.make_jaxpr(fn)(*args)
    back = Graph.from_jaxpr(closed).to_jaxpr()
    _jax.check_jaxpr(back)
    assert format_graph(Graph.from_jaxpr(back)) == format_graph(Graph.from_jaxpr(closed))
    flat = jax.tree_util.tree_leaves(args)
    _bits_equal(jax.jit(lambda *a: _jax.eval_jaxpr(closed, *a))(*flat),
                jax.jit(lambda *a: _jax.eval_jaxpr(back, *a))(*flat))


@pytest.mark.parametrize("name,fn,args,diff", PROGRAMS, ids=IDS)
def test_optimize_matches(name, fn, args, diff):
    opt = jaxform.optimize(fn)
    assert_same(fn, opt, *args, grad=diff, vmap=name not in ("shard_map_program",), rtol=2e-5, atol=2e-5)
    assert opt.cache_size() == 1


SHARDED = ["elementwise_broadcast", "matmul_chain", "rnn_mse_loss", "mlp_train_step", "attention", "scan_rnn"]


@pytest.mark.parametrize("name,fn,args,diff", [p for p in PROGRAMS if p[0] in SHARDED], ids=SHARDED)
def test_sharded_jit(name, fn, args, diff):
    assert jax.device_count() == 8
    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    rep = jax.sharding.NamedSharding(mesh, jax.P())

    def shard(a):  # shard the leading axis where it divides, replicate otherwise
        ok = a.ndim and a.shape[0] % 8 == 0
        return jax.device_put(a, jax.sharding.NamedSharding(mesh, jax.P("d")) if ok else rep)
    sargs = jax.tree_util.tree_map(shard, args)
    want = jax.jit(fn)(*sargs)
    got = jax.jit(jaxform.optimize(fn), out_shardings=rep)(*sargs)
    for x, y in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)
        assert y.sharding.is_equivalent_to(rep, y.ndim)
