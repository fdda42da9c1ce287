"""docs/recipes.md cannot rot: each ```python block is a complete recipe, run on its own."""
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "recipes.md"


def blocks() -> list[tuple[int, str, str]]:
    """(first line number, heading, code) of every ```python block."""
    text = DOC.read_text()
    out = []
    for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M):
        heading = re.findall(r"^## (.*)$", text[:m.start()], re.M)[-1]
        out.append((text[:m.start(1)].count("\n") + 1, heading, m.group(1)))
    return out


def test_recipes_present():
    headings = [h for _, h, _ in blocks()]
    assert any("Equinox" in h for h in headings) and any("Linen" in h for h in headings)


@pytest.mark.parametrize("line,heading,code", blocks(), ids=[h for _, h, _ in blocks()])
def test_recipe_runs(line, heading, code):
    if "nnx" in code:
        pytest.importorskip("flax.nnx")
    if "equinox" in code:
        pytest.importorskip("equinox")
    ns: dict = {"__name__": f"recipe_{line}"}
    # padded so that tracebacks point at the doc's own lines
    exec(compile("\n" * (line - 1) + code, str(DOC), "exec"), ns)
