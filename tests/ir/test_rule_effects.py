"""Effects inside custom derivative rules (a custom_jvp's jvp, a custom_vjp's fwd and bwd) make the call impure:
the rule lives once in the IR, and JAX types the call by its primal body only (issue 38)."""
import jax
import jax.numpy as jnp
import pytest

import jaxform
from jaxform.ir.identity import is_impure, rules_impure


def _jvp_with(effect):
    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    @f.defjvp
    def f_jvp(p, t):
        if effect:
            jax.debug.callback(lambda v: None, p[0])
        return jnp.sin(p[0]), jnp.cos(p[0]) * t[0]
    return f


def _vjp_with(where):
    @jax.custom_vjp
    def g(x):
        return jnp.sin(x)

    def fwd(x):
        if where == "fwd":
            jax.debug.callback(lambda v: None, x)
        return jnp.sin(x), (x, jnp.cos(x))

    def bwd(res, ct):
        if where == "bwd":
            jax.debug.callback(lambda v: None, ct)
        return (res[1] * ct,)
    g.defvjp(fwd, bwd)
    return g


def _call(fn):
    (node,) = [n for n, _ in jaxform.trace(lambda x: fn(x).sum(), jnp.ones(3)).walk() if n.name.startswith("custom_")]
    return node


@pytest.mark.parametrize("fn, impure", [
    (_jvp_with(True), True), (_jvp_with(False), False),
    (_vjp_with("fwd"), True), (_vjp_with("bwd"), True), (_vjp_with(None), False),
    (jax.nn.relu, False),             # its rule calls relu again (a rule inside a rule): pure, and it terminates
], ids=["jvp-callback", "jvp-pure", "fwd-callback", "bwd-callback", "vjp-pure", "relu"])
def test_effects_inside_rules_are_seen(fn, impure):
    node = _call(fn)
    assert not node.effects                  # JAX's own typing does not see the rule's effect
    assert rules_impure(node) is impure and is_impure(node) is impure


def test_a_loop_holding_an_impure_rule_is_impure():
    f = _jvp_with(True)
    g = jaxform.trace(lambda w, xs: jax.lax.scan(lambda c, x: (f(c * w + x), c), jnp.zeros(3), xs)[0].sum(),
                      jnp.ones(3), jnp.ones((4, 3)))
    (scan,) = [n for n in g.nodes if n.name == "scan"]
    assert is_impure(scan)
