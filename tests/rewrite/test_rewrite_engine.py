"""Rules + driver: traced and builder replacements, fixpoint, nested bodies, cycles, stats, rewrite()."""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import Pat, Rules, rewrite
from jaxform.ir import Graph
from jaxform.optimize import PassError
from jaxform.rewrite import RewriteError, RewriteStats
from jaxform.testing import assert_same

rng = np.random.default_rng(1)
X = rng.normal(size=(3, 4)).astype(np.float32)
x_ = Pat.any("x")

LOG_EXP = (Pat("log", Pat("exp", x_)), lambda x: x, "log(exp(x))")
NEG_NEG = (Pat("neg", Pat("neg", x_)), lambda x: x, "--x")
TIMES2 = (Pat("mul", x_, Pat.const(2)), lambda x, ctx: ctx.add(x, x), "x*2 -> x+x")


def prims(fn_or_graph, *args) -> list[str]:
    g = fn_or_graph if isinstance(fn_or_graph, Graph) else Graph.from_jaxpr(jax.make_jaxpr(fn_or_graph)(*args))
    return [n.prim.name for n, _ in g.walk()]


def test_traced_replacement_is_spliced_with_the_roots_source_info():
    rules = Rules([(Pat("log", Pat("add", x_, Pat.const(1))), lambda x: jnp.log1p(x))])
    g = jaxform.trace(lambda x: jnp.log(1.0 + x), X)
    root = g.outputs[0].producer
    stats = rules.apply(g)
    assert [n.prim.name for n in g.nodes] == ["log1p"]
    assert g.nodes[0].source_info is root.source_info
    assert stats.fired == {"log(add(x, 1)) -> ...": 1}


def test_builder_replacement():
    g = jaxform.trace(lambda x: jnp.sin(x) * 2.0, X)
    Rules([TIMES2]).apply(g)
    assert [n.prim.name for n in g.nodes] == ["sin", "add"]
    np.testing.assert_allclose(g.evaluate(X)[0], np.sin(X) * 2, rtol=1e-6)


def test_builder_bind_with_params_and_scalars():
    rules = Rules([(Pat("reduce_max", x_, params={"axes": Pat.bind("axes")}),
                    lambda x, axes, ctx: ctx.neg(ctx.bind("reduce_min", ctx.neg(x), axes=axes)),
                    "max = -min(-x)")])
    fn = lambda x: jnp.max(x, axis=1)
    f2 = rewrite(fn, rules)
    assert_same(fn, f2, X)
    assert "reduce_max" not in prims(f2, X)


def test_none_declines_and_builder_leftovers_are_removed():
    def maybe(x, ctx):
        ctx.exp(x)   # built, then declined: must not stay in the graph
        return None
    g = jaxform.trace(lambda x: jnp.sin(x), X)
    assert Rules([(Pat("sin", x_), maybe)]).apply(g).total == 0
    assert [n.prim.name for n in g.nodes] == ["sin"]
    g = jaxform.trace(lambda x: jnp.sin(x), X)
    assert Rules([(Pat("sin", x_), lambda x: None if x.ndim == 2 else jnp.cos(x))]).apply(g).total == 0


def test_replacement_returning_the_root_itself_is_no_change():
    g = jaxform.trace(lambda x: jnp.sin(x), X)
    assert Rules([(Pat("sin", name="s"), lambda s, ctx: s)]).apply(g).total == 0


def test_fixpoint_chains_and_traces_are_cached():
    calls = []

    def unwrap(x):
        calls.append(1)
        return x
    fn = lambda x: -(-(-(-(-(-jnp.sin(x))))))     # six negations
    g = jaxform.trace(fn, X)
    stats = Rules([(Pat("neg", Pat("neg", x_)), unwrap, "--x")]).apply(g)
    assert [n.prim.name for n in g.nodes] == ["sin"] and stats.fired["--x"] == 3
    assert len(calls) == 1   # one trace for one input signature


def test_a_rewrite_exposes_a_new_match_above_it():
    # x*1 only appears once the inner --y is gone: the driver revisits the users of changed values.
    rules = Rules([NEG_NEG, (Pat("log", Pat("exp", Pat("sin", x_))), lambda x: jnp.sin(x), "log(exp(sin))")])
    fn = lambda x: jnp.log(jnp.exp(-(-jnp.sin(x))))
    g = jaxform.trace(fn, X)
    stats = rules.apply(g)
    assert [n.prim.name for n in g.nodes] == ["sin"] and stats.total == 2


def test_literal_captures_arrive_as_concrete_scalars():
    # (x * a) * b -> x * (a*b) with a, b literals: folded at rewrite time.
    rules = Rules([(Pat("mul", Pat("mul", x_, Pat.any("a", where=lambda v: v.is_literal)),
                        Pat.any("b", where=lambda v: v.is_literal)), lambda x, a, b: x * (a * b), "fold")])
    fn = lambda x: (jnp.sin(x) * 3.0) * 5.0
    g = jaxform.trace(fn, X)
    rules.apply(g)
    assert [n.prim.name for n in g.nodes] == ["sin", "mul"] and g.nodes[1].inputs[1].literal == 15.0


def user_sin(x):
    return jnp.sin(x)


SIN_LINE = f"test_rewrite_engine.py:{user_sin.__code__.co_firstlineno + 1}"


@pytest.mark.parametrize("fn,got", [
    (lambda x: x[0], r"\['f32\[4\]'\]"),                                  # wrong shape (traced)
    (lambda x: x.astype(jnp.int32), r"\['i32\[3,4\]'\]"),                # wrong dtype (traced)
    (lambda x, ctx: ctx.reduce_sum(x, axes=(0,)), r"\['f32\[4\]'\]"),     # wrong shape (builder)
    (lambda x, ctx: 0.0, r"\['float'\]"),                                 # not a Value (builder)
    (lambda x, ctx: [x, x], r"\['f32\[3,4\]', 'f32\[3,4\]'\]"),          # too many outputs
])
def test_replacement_of_wrong_type_is_a_clear_error(fn, got):
    g = jaxform.trace(user_sin, X)
    with pytest.raises(RewriteError, match=rf"rule 'bad' replaced sin at \S*{SIN_LINE}\S* \(user_sin\) \(\['f32\[3,4\]'\]\) "
                                           rf"by values of type {got}; .*same shapes and dtypes"):
        Rules([(Pat("sin", x_), fn, "bad")]).apply(g)


@pytest.mark.parametrize("rule,part", [
    ((Pat("sin", x_), lambda x: 1 / 0, "oops"), "replacement"),                       # traced
    ((Pat("sin", x_), lambda x, ctx: 1 / 0, "oops"), "replacement"),                  # builder
    ((Pat("sin", x_, where=lambda v: 1 / 0), lambda x: x, "oops"), "pattern"),        # predicate
    ((Pat("sin", x_, params=lambda p: 1 / 0), lambda x: x, "oops"), "pattern"),
])
def test_rule_that_raises_names_the_rule_and_the_line(rule, part):
    g = jaxform.trace(user_sin, X)
    with pytest.raises(RewriteError, match=rf"the {part}.* of rule 'oops' failed.* at \S*{SIN_LINE}\S* \(user_sin\)\): "
                                           r"ZeroDivisionError"):
        Rules([rule]).apply(g)


def test_rule_errors_through_rewrite_keep_the_message():
    f2 = rewrite(user_sin, [(Pat("sin", x_), lambda x: x[0], "bad")])
    with pytest.raises(PassError, match=rf"rule 'bad' replaced sin at \S*{SIN_LINE}"):
        f2(X)
    f3 = rewrite(user_sin, [(Pat("sin", x_), lambda x, ctx: ctx.no_such_prim(x), "unknown")])
    with pytest.raises(PassError, match=rf"replacement of rule 'unknown' failed on captures \{{x: f32\[3,4\]\}} "
                                        rf"\(matched sin at \S*{SIN_LINE}\S* \(user_sin\)\)"):
        f3(X)


def test_root_must_name_a_primitive():
    with pytest.raises(ValueError, match="root of a rule's pattern"):
        Rules([(Pat.any("x"), lambda x: x)])


def test_cycle_error_names_the_rules():
    ab = Rules([(Pat("sin", x_), lambda x: jnp.cos(x - np.float32(0) * 0), "sin->cos-ish"),
                (Pat("cos", x_), lambda x: jnp.sin(x), "cos->sin")])
    g = jaxform.trace(lambda x: jnp.sin(x) + 1.0, X)
    with pytest.raises(RewriteError, match=r"do not terminate.*'sin->cos-ish'.*'cos->sin'|"
                                           r"do not terminate.*'cos->sin'.*'sin->cos-ish'"):
        ab.apply(g)
    # a single rule that re-matches its own output
    grow = Rules([(Pat("exp", x_), lambda x: jnp.exp(x * 1.0), "exp grows")])
    with pytest.raises(RewriteError, match=r"test_rewrite_engine.py:\d+.*'exp grows'"):
        grow.apply(jaxform.trace(lambda x: jnp.exp(x), X))


def test_cycle_error_through_rewrite_is_raised_by_default():
    f2 = rewrite(lambda x: jnp.exp(x), [(Pat("exp", x_), lambda x: jnp.exp(x * 1.0), "exp grows")])
    with pytest.raises(PassError, match="do not terminate"):
        f2(X)


def nested(x, loop=True):
    def body(c, a):
        return c + jnp.log(jnp.exp(a)), -(-a)
    c, ys = lax.scan(body, x[0], x)
    y = lax.cond(x.sum() > 0, lambda v: jnp.log(jnp.exp(v)), lambda v: -(-v), x)
    w = lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, jnp.log(jnp.exp(s[1])) * 0.5), (0, x))[1] \
        if loop else x
    j = jax.jit(lambda v: jax.jit(lambda u: -(-jnp.sin(u)))(v) * 2.0)(x)
    return c, ys, y, w, j


def test_rules_fire_inside_scan_cond_while_and_jit_bodies():
    assert prims(nested, X).count("exp") == 3 and prims(nested, X).count("neg") == 6
    f2 = rewrite(nested, [LOG_EXP, NEG_NEG])
    assert_same(nested, f2, X, grad=False)   # no reverse-mode through while_loop
    left = prims(f2, X)
    assert "exp" not in left and "neg" not in left
    assert {"scan", "cond", "while"} <= set(left) and {"jit", "pjit"} & set(left)   # bodies rewritten in place
    assert f2.stats.fired == {"log(exp(x))": 3, "--x": 3}


def test_nested_rewrites_under_jit_grad_vmap_of_the_wrapper():
    f2 = rewrite(nested, [LOG_EXP, NEG_NEG, TIMES2], static_argnums=1)
    xs = np.stack([X, -X])
    for a, b in [(jax.jit(nested)(X), jax.jit(f2)(X)), (jax.vmap(nested)(xs), jax.vmap(f2)(xs))]:
        jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-5), a, b)
    loss = lambda f: lambda x: sum(jnp.sum(o) for o in f(x))
    no_loop = lambda f: lambda x: f(x, False)
    np.testing.assert_allclose(jax.grad(loss(no_loop(nested)))(X), jax.grad(loss(no_loop(f2)))(X), rtol=1e-5)
    assert f2.stats.fired["x*2 -> x+x"] == 2


def test_stats_record_user_source_lines():
    def fn(x):
        y = jnp.sin(x)
        line = sys._getframe().f_lineno + 2
        seen.append(line)
        return jnp.log(jnp.exp(y))
    seen = []
    f2 = rewrite(fn, [LOG_EXP])
    f2(X)
    where = f2.stats.where("log(exp(x))")
    assert list(where.values()) == [1]
    assert f"test_rewrite_engine.py:{seen[0]}" in next(iter(where))
    assert "log(exp(x))" in str(f2.stats) and f"test_rewrite_engine.py:{seen[0]}" in str(f2.stats)
    f2(np.ones((2,), np.float32))   # a new signature: traced again, stats accumulate
    assert f2.stats.fired["log(exp(x))"] == 2


def test_rules_as_a_pass_in_optimize_and_as_decorator():
    rules = Rules(name="mine")

    @rules.add(Pat("neg", Pat("neg", x_)), name="dneg", exact=True)
    def dneg(x):
        return x
    assert rules.exact and len(rules) == 1 and rules.pass_name == "mine"
    fn = lambda x: -(-jnp.cos(x))
    f2 = jaxform.optimize(fn, passes=[rules], strict=True)
    assert_same(fn, f2, X)
    assert "neg" not in prims(f2, X)
    both = rules + Rules([LOG_EXP])
    assert len(both) == 2 and not both.exact


def test_rewrite_as_decorator_with_static_args():
    @rewrite(rules=[NEG_NEG], static_argnums=1)
    def f(x, n):
        for _ in range(n):
            x = -x
        return x
    np.testing.assert_array_equal(f(X, 4), X)
    assert f.stats.fired["--x"] == 2 and "neg" not in prims(lambda x: f(x, 4), X)


def test_array_constant_in_a_body_that_cannot_hold_one_is_a_clear_error():
    rules = [(Pat("sin", x_), lambda x: x + np.arange(4, dtype=np.float32), "adds a constant")]
    remat = rewrite(lambda x: jax.checkpoint(jnp.sin)(x), rules)     # remat bodies are open jaxprs
    with pytest.raises(PassError, match="'adds a constant' builds an array constant"):
        remat(X)
    top = rewrite(jnp.sin, rules)      # at top level (and in scan/jit bodies) constants are fine
    np.testing.assert_allclose(top(X), X + np.arange(4))
    assert top.stats.total == 1


def test_rules_are_dispatched_by_root_primitive():
    tried = []
    spy = lambda prim: Pat(prim, x_, where=lambda v: tried.append(v.producer.prim.name) or False)
    rules = Rules([(spy("sin"), lambda x: x), (spy({"exp", "log"}), lambda x: x)])
    g = jaxform.trace(lambda x: jnp.log(jnp.cos(jnp.sin(jnp.tanh(x)) * 2.0)), X)
    rules.apply(g)
    assert sorted(tried) == ["log", "sin"]      # cos, tanh, mul never looked at by these rules


# ---- issue 15, finding 18: malformed rule sets are errors, not empty rule sets ----

def test_malformed_rules_raise():
    import jaxform as jf
    with pytest.raises(TypeError, match="the class Pat itself"):
        jf.Rules([jf.Pat])
    with pytest.raises(TypeError, match="a rule is a Rule"):
        jf.Rules([3])
    with pytest.raises(TypeError, match="a rule is a Rule"):
        jf.rewrite(lambda x: x, [3])
    with pytest.raises(TypeError, match="list of rules"):
        jf.Rules(jf.Pat("sin"))


def test_misspelled_primitive_raises_with_suggestion():
    import jaxform as jf
    with pytest.raises(ValueError, match="no JAX primitive named 'sinn'.*Did you mean.*sin"):
        jf.Pat("sinn")
    with pytest.raises(ValueError, match="'exq'"):
        jf.Pat({"exp", "exq"})
    jf.Pat("sin"), jf.Pat({"add", "add_any"}), jf.Pat(jax.lax.sin_p)
