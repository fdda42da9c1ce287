"""docs/extending.md's tutorial runs as written: its code blocks, in order, in one namespace."""
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def test_tutorial_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 3 and sum(len(b.splitlines()) for b in blocks) <= 80
    ns: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), ns)
    out = capsys.readouterr().out
    assert "hoist_cholesky: kept" in out and "hoist_broadcast_in_dim: rejected" in out
