"""show: before/after text with stable names, so the diff shows exactly what the passes changed."""
import jax
import jax.numpy as jnp
import pytest

import jaxform
from jaxform.ir import Graph
from jaxform.inspect.match import match
from programs import H, L, B, mse, nested, rnn_args, twice


def changed_lines(diff: str) -> list[str]:
    return [l for l in diff.splitlines() if l[:1] in "+-" and not l.startswith(("+++", "---"))]


def test_flagship_diff_shows_the_reduction_moving_into_the_body():
    s = jaxform.show(mse, *rnn_args())
    assert s.fired == ["fuse_scan_reductions"]
    assert s.passes == list(jaxform.passes.DEFAULT)
    changed = changed_lines(s.diff)
    # the full-size elementwise chain and reduction are gone from the outer program...
    assert any(l.startswith("-") and f"f32[{L},{B},{H}] = sub" in l for l in changed)
    assert any(l.startswith("-") and "reduce_sum[axes=(0, 1, 2)]" in l for l in changed)
    # ... and per-step versions appear in the body, accumulated in a new carry
    assert any(l.startswith("+") and f"f32[{B},{H}] = sub" in l for l in changed)
    assert any(l.startswith("+") and "num_carry=2" in l for l in changed)
    # untouched body equations keep their names, so they are not in the diff
    assert not any("tanh" in l or "dot_general" in l for l in changed)
    assert "tanh" in s.before and "tanh" in s.after
    text = str(s)
    assert s.before in text and s.after in text and s.diff in text and "fuse_scan_reductions" in text


def test_no_change_has_empty_diff():
    s = jaxform.show(jnp.sin, jnp.ones(3), passes=["cse", "dce"])
    assert s.fired == [] and s.diff == "" and s.before == s.after
    assert "(no change)" in str(s)


def test_cse_diff_is_only_the_duplicate():
    s = jaxform.show(twice, jnp.ones(3), passes="cse,dce")
    assert s.fired == ["cse"] and s.passes == ["cse", "dce"]
    removed = [l for l in changed_lines(s.diff) if l.startswith("-")]
    assert sum(" sin " in l for l in removed) == 1 and sum(" mul " in l for l in removed) == 1
    assert s.after.count(" sin ") == 1 and s.before.count(" sin ") == 2


def test_nested_bodies_are_indented():
    s = jaxform.show(nested, jnp.ones(3), jnp.ones((5, 3)), passes=["cse"])
    assert s.fired == ["cse"]
    depth = lambda text, prim: min(len(l) - len(l.lstrip()) for l in text.splitlines() if f"= {prim}" in l)  # noqa
    # sin lives in a cond branch inside the scan body: deeper than the cond, deeper than the scan
    assert depth(s.after, "sin") > depth(s.after, "cond") > depth(s.after, "scan")
    assert s.before.count("= sin") == 2 and s.after.count("= sin") == 1


def test_shape_dtype_struct_and_pytree_args():
    f = lambda p, x: jnp.sin(x @ p["w"]) + jnp.sin(x @ p["w"])  # noqa: E731
    p = {"w": jax.ShapeDtypeStruct((4, 4), jnp.float32)}
    s = jaxform.show(f, p, jax.ShapeDtypeStruct((2, 4), jnp.float32), passes=["cse"])
    assert s.fired == ["cse"] and "f32[4,4]" in s.before


def test_unknown_pass_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown pass 'csee'.*cse"):
        jaxform.show(twice, jnp.ones(3), passes=["csee"])


def test_match_marks_only_what_changed():
    closed = jax.make_jaxpr(twice)(jnp.ones(3))
    g = Graph.from_jaxpr(closed)
    same = match(g, Graph.from_jaxpr(closed))
    assert not same.new and not same.removed
    after = jaxform.passes.cse(Graph.from_jaxpr(closed))
    m = match(g, after)
    assert sorted(n.name for n in m.removed_nodes) == ["mul", "sin"]
    assert [n.name for n in m.new_nodes] == []   # cse adds nothing: `add` is rewired, not new


def test_body_inputs_follow_their_operands():
    def loop(x, y):
        return jax.lax.fori_loop(0, 3, lambda i, c: c * y + jnp.sin(x) * jnp.cos(x), x)
    s = jaxform.show(loop, jnp.ones(2), jnp.ones(2), passes=["hoist_loop_invariants"])
    assert s.fired == ["hoist_loop_invariants"]
    changed = changed_lines(s.diff)
    assert any(l.startswith("+") and "num_consts=3" in l for l in changed)
    assert any(l.startswith("-") and " sin " in l for l in changed) and any(l.startswith("+") and " sin " in l
                                                                            for l in changed)
    # a new f32[2] constant is inserted before the f32[2] carry; the carry keeps its name, so the body's
    # `c * y` prints the same, while the hoisted `sin(x) * cos(x)` left the body
    carry_mul, invariant_mul = [l.strip() for l in s.before.splitlines() if "= mul " in l]
    assert carry_mul in [l.strip() for l in s.after.splitlines()]
    assert not any(carry_mul in l for l in changed) and any(invariant_mul in l for l in changed)
