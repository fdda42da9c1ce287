"""Every op class PyTensor's JAX backend registers (`jax_funcify`'s dispatch table, with PyTensor's own subclasses
of those classes) and what jaxform does with it: native, partial (a converter for the common cases), fallback
(PyTensor's jax_funcify traced and spliced in) or unsupported (jax_funcify raises too). The table is compared
with the one recorded for this pytensor minor in op_tables/, so an op a new PyTensor adds, renames or changes
fails here, not in a user's model (issue 28: Split changed in pytensor 3.1 and no test saw it).

Record the table of a new pytensor with `python tests/frontends/test_op_table.py --write` and review the diff.
(Assumes tensorflow-probability is not installed: with it, the tfp-backed scalar ops would become fallbacks.)
"""
import json
import pathlib
import sys

import pytest

pytensor = pytest.importorskip("pytensor")

from jaxform.frontends import pytensor as jpt  # noqa: E402

TABLES = pathlib.Path(__file__).parent / "op_tables"
STATES = {"native", "partial", "fallback", "unsupported"}


def _version() -> str:
    return ".".join(pytensor.__version__.split(".")[:2])


def _table_path() -> pathlib.Path:
    return TABLES / f"pytensor-{_version()}.json"


def test_op_table_matches_recorded():
    got = jpt.op_table()
    assert set(got.values()) <= STATES
    path = _table_path()
    if not path.exists():
        pytest.fail(f"no recorded op table for pytensor {pytensor.__version__} ({path.name}): run "
                    f"`python tests/frontends/test_op_table.py --write`, review which ops are native / fall back / "
                    f"unsupported, and commit it")
    want = json.loads(path.read_text())
    added = sorted(set(got) - set(want))
    gone = sorted(set(want) - set(got))
    changed = sorted(f"{k}: {want[k]} -> {got[k]}" for k in set(got) & set(want) if got[k] != want[k])
    assert not (added or gone or changed), (
        f"pytensor {pytensor.__version__}'s JAX ops differ from {path.name}:\n  new: {added}\n  gone: {gone}\n"
        f"  changed: {changed}\nCheck each new op (give it a converter or a test of its fallback), then re-record "
        "with `python tests/frontends/test_op_table.py --write`.")


def test_ops_of_issue_28_are_native():
    """The ops issue 28 found failing or falling back are native on every pytensor that has them."""
    table = jpt.op_table()
    for op in ["pytensor.tensor.basic.Split", "pytensor.scalar.math.GammaIncC", "pytensor.scalar.math.GammaInc",
               "pytensor.tensor.special.LogSumExp", "pytensor.tensor.basic.Join", "pytensor.scalar.math.Erfcx"]:
        if op in table or op != "pytensor.tensor.special.LogSumExp":   # LogSumExp is an op since pytensor 3
            assert table.get(op) == "native", (op, table.get(op))


def test_unsupported_ops_raise_naming_the_op():
    """An op neither jaxform nor PyTensor's JAX backend runs is a ConversionError that names it."""
    import pytensor.tensor as pt
    import jax
    table = jpt.op_table()
    if table.get("pytensor.scalar.math.GammaIncCInv") != "unsupported":
        pytest.skip("GammaIncCInv runs here (tensorflow-probability installed)")
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        k, q = pt.tensor("k", shape=(3,)), pt.tensor("q", shape=(3,))
        with pytest.raises(Exception, match="GammaIncCInv|gammainccinv"):
            jpt.to_graph([k, q], pt.gammainccinv(k, q))
    finally:
        jax.config.update("jax_enable_x64", before)


if __name__ == "__main__":
    if "--write" in sys.argv:
        TABLES.mkdir(exist_ok=True)
        _table_path().write_text(json.dumps(jpt.op_table(), indent=1) + "\n")
        print("wrote", _table_path())
