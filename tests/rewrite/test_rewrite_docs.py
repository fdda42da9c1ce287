"""docs/rewrite.md cannot rot: its ```python blocks run, in order, in one namespace."""
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "rewrite.md"


def blocks() -> list[tuple[int, str]]:
    """(first line number, code) of every ```python block."""
    text = DOC.read_text()
    return [(text[:m.start(1)].count("\n") + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M)]


def test_doc_has_code_and_numbers():
    assert len(blocks()) >= 8
    assert "BENCHMARK_TABLE" not in DOC.read_text()


def test_doc_code_runs(capsys):
    ns: dict = {"__name__": "rewrite_doc"}
    for line, code in blocks():
        # padded so that tracebacks and rewrite stats point at the doc's own lines
        exec(compile("\n" * (line - 1) + code, str(DOC), "exec"), ns)
    out = capsys.readouterr().out
    assert re.search(r"stable logsumexp  at \S*rewrite.md:\d+", out)    # stats name the user's source line
    print(out)
