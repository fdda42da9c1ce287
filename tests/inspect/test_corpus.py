"""show / match / draw on every program of the shared corpus (all primitive families, bodies, grads)."""
import jax
import pytest

import jaxform
from corpus import PROGRAMS
from jaxform.ir import Graph
from jaxform.inspect.match import match


@pytest.mark.parametrize("name, fn, args, differentiable", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_inspect_corpus_program(name, fn, args, differentiable, tmp_path):
    closed = jax.make_jaxpr(fn)(*args)
    same = match(Graph.from_jaxpr(closed), Graph.from_jaxpr(closed))
    assert not same.new and not same.removed          # a program matches itself completely
    s = jaxform.show(fn, *args)
    assert (s.diff == "") == (s.fired == [])
    page = open(jaxform.draw(fn, *args, path=tmp_path / "p.html")).read()
    assert page.count("<svg") == 2
    if s.fired:
        assert 'class="node new"' in page or 'class="node removed"' in page
