"""Runs the "Recipe" code block of docs/autograph.md (a NumPy-style RK4 integrator) and checks
it against the same function run as plain Python, and that reverse-mode grad goes through."""
import importlib.util
import os
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

DOC = os.path.join(os.path.dirname(__file__), '..', '..', 'docs', 'autograph.md')


def _recipe_module():
  text = open(DOC).read()
  section = text[text.index('## Recipe'):]
  code = re.search(r'```python\n(.*?)```', section, re.S).group(1)
  path = os.path.join(tempfile.mkdtemp(), 'autograph_recipe.py')  # autograph reads source files
  with open(path, 'w') as f:
    f.write(code)
  spec = importlib.util.spec_from_file_location('autograph_recipe', path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_recipe_rk4():
  m = _recipe_module()
  ts, ys = m.ts, m.ys
  assert ys.shape == (201, 2) and ts.shape == (201,)
  want_ts, want_ys = m.rk4(m.lotka_volterra, jnp.array([10.0, 5.0]), 0.0, 10.0, 200)  # plain Python
  np.testing.assert_allclose(ys, want_ys, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(ts, want_ts, rtol=1e-5, atol=1e-5)
  jaxpr = str(jax.make_jaxpr(lambda y0: m.solve(m.lotka_volterra, y0, 0.0, 10.0, 200))(jnp.array([10.0, 5.0])))
  assert 'scan' in jaxpr
  g = jax.grad(lambda y0: m.solve(m.lotka_volterra, y0, 0.0, 1.0, 20)[1][-1].sum())(jnp.array([10.0, 5.0]))
  eps = 1e-2
  fd = [(m.rk4(m.lotka_volterra, jnp.array([10.0, 5.0]) + eps * e, 0.0, 1.0, 20)[1][-1].sum()
         - m.rk4(m.lotka_volterra, jnp.array([10.0, 5.0]) - eps * e, 0.0, 1.0, 20)[1][-1].sum()) / (2 * eps)
        for e in jnp.eye(2)]
  np.testing.assert_allclose(g, fd, rtol=2e-2, atol=2e-2)
