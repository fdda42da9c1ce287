"""docs/design.md's module map is the package as it is: every module it names exists, and every
module of the package (jaxform/**/*.py) is named there, once per module."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
NAMED = re.compile(r"`(jaxform/[\w/]+\.py)`")


def named_modules(text: str) -> set[str]:
    return set(NAMED.findall(text))


def package_modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "jaxform").rglob("*.py")}


def test_every_named_module_exists():
    gone = sorted(m for m in named_modules(DESIGN.read_text()) if not (ROOT / m).is_file())
    assert not gone, f"docs/design.md names modules that no longer exist: {gone}"


def test_every_package_module_is_in_the_map():
    missing = sorted(package_modules() - named_modules(DESIGN.read_text()))
    assert not missing, f"modules missing from docs/design.md's module map: {missing}"


def test_the_check_can_fail():
    text = "| `jaxform/ir/graph.py` | Graph |\n| `jaxform/ir/evaluate.py` | gone |"
    assert named_modules(text) == {"jaxform/ir/graph.py", "jaxform/ir/evaluate.py"}
    assert not (ROOT / "jaxform/ir/evaluate.py").exists()
    assert len(package_modules()) > 50


def test_readme_links_the_design():
    layout = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    assert "docs/design.md" in layout and "../shared" not in layout
