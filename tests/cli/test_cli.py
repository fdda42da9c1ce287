"""The `jaxform` command: subprocess runs on examples/inspect_me.py, argument specs, one-line errors."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from jaxform import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "inspect_me.py")
LOSS_ARGS = ["--arg", "f32[16,16]", "--arg", "f32[50,8,16]"]


def jaxform_cmd(*args, timeout=240):
    """Run `python -m jaxform ...` as a user would, from the repository root."""
    env = {**os.environ, "JAXFORM_CHECK": "1"}
    return subprocess.run([sys.executable, "-m", "jaxform", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_inspect_subprocess_with_html(tmp_path):
    html = tmp_path / "loss.html"
    r = jaxform_cmd("inspect", f"{EXAMPLE}:loss", *LOSS_ARGS, "--html", str(html))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for fired in ("inline", "hoist_loop_invariants", "fuse_scan_reductions"):
        assert f"  {fired}: equations" in out
    assert "inspect_me.py:19 (loss)" in out                  # where the fused reduction was written
    assert "XLA temp memory" in out and "\n+    " in out and "\n-    " in out   # report, then the diff
    assert "compiling" in r.stderr and f"wrote {html}" in r.stderr                # progress on stderr
    assert "<svg" in html.read_text()


def test_inspect_pytree_arg_json_and_passes():
    r = jaxform_cmd("inspect", f"{EXAMPLE}:pair", "--arg", "(f32[4,4], f32[4])", "--arg", "f32[4]",
                    "--passes", "cse,dce", "--json", "--no-memory")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["passes"] == ["cse", "dce"] and [c["pass_name"] for c in d["changes"]] == ["cse"]
    assert d["eqns"] == [7, 4] and d["temp_bytes"] is None


def test_passes_subprocess():
    r = jaxform_cmd("passes")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    import jaxform
    for i, name in enumerate(jaxform.passes.DEFAULT):
        line = next(l for l in lines if f" {name} " in l)
        assert line.split()[0] == str(i + 1)
        assert len(line.split(maxsplit=3)) == 4    # a one-line doc after the name and exactness
    assert any(" algebra " in l for l in lines)


@pytest.mark.parametrize("argv, message", [
    (["inspect", "no/such/file.py:f", "--arg", "f32[3]"], "no such file: no/such/file.py"),
    (["inspect", f"{EXAMPLE}:los"] + LOSS_ARGS, "has no function 'los'; did you mean loss"),
    (["inspect", f"{EXAMPLE}:NOT_A_FUNCTION"], "is a int, not a function"),
    (["inspect", EXAMPLE, "--arg", "f32[3]"], "expected FILE.py:FUNCTION"),
    (["inspect", f"{EXAMPLE}:loss", "--arg", "f33[16,16]"], "unknown dtype 'f33' (did you mean f32?)"),
    (["inspect", f"{EXAMPLE}:loss", "--arg", "f32[16,x]"], "bad --arg 'f32[16,x]'"),
    (["inspect", f"{EXAMPLE}:pair", "--arg", "(f32[4,4], f32[4]"], "missing ')'"),
    (["inspect", f"{EXAMPLE}:pair", "--arg", "f32[4] f32[4]"], "one value per --arg"),
    (["inspect", f"{EXAMPLE}:loss", "--passes", "cse,nope"] + LOSS_ARGS, "unknown pass 'nope'"),
    (["inspect", f"{EXAMPLE}:loss", "--svg", "/tmp/x.txt"] + LOSS_ARGS, "use a path ending in .html"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "required: {demo,inspect,passes}"),
])
def test_usage_errors_are_one_line_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("jaxform: error: ") and message in err, err
    assert out == ""


def test_usage_error_subprocess():
    r = jaxform_cmd("inspect", f"{EXAMPLE}:loss", "--arg", "float[3]")
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("jaxform: error: bad --arg 'float[3]': unknown dtype 'float'")


def test_failing_user_function_is_one_line_exit_1(capsys):
    assert cli.main(["inspect", f"{EXAMPLE}:loss", "--arg", "f32[16,16]", "--arg", "f32[50,8,15]"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"jaxform: error: {EXAMPLE}:loss: TypeError: ") and "--traceback" in err[-1]
    with pytest.raises(TypeError):
        cli.main(["inspect", f"{EXAMPLE}:loss", "--arg", "f32[16,16]", "--arg", "f32[50,8,15]", "--traceback"])


def test_parse_spec():
    S = jax.ShapeDtypeStruct
    assert cli.parse_spec("f32[1000,256,128]") == S((1000, 256, 128), jnp.float32)
    assert cli.parse_spec("i32[]") == S((), jnp.int32)
    assert cli.parse_spec(" bf16[ 2 , 3 ] ") == S((2, 3), jnp.bfloat16)
    assert cli.parse_spec("(f32[2], (bool[3], u8[1]),)") == (S((2,), jnp.float32), (S((3,), jnp.bool_),
                                                                                      S((1,), jnp.uint8)))
    assert cli.parse_spec("()") == ()
    assert cli.parse_spec("float32[2]") == S((2,), jnp.float32) and cli.parse_spec("c64[]") == S((), jnp.complex64)
    for bad in ("f32", "f32[2", "(f32[2],,)", ")", "f32[2])", "f32[-1]"):
        with pytest.raises(cli.UsageError):
            cli.parse_spec(bad)


def test_demo_small(capsys):
    assert cli.main(["demo", "--length", "30", "--batch", "8", "--hidden", "16", "--features", "4",
                     "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "fuse_scan_reductions: equations" in out and "cli.py" in out      # what fired, and where
    assert "num_carry=2" in out                                              # the diff
    assert "  loss " in out and "  grad " in out and "ms ->" in out and "less)" in out
    assert out.rstrip().endswith("OK")
    tour = out[out.index("The rest of the toolbox"):]
    for what in ("hoist_loop_invariants", "rule_by_example", "autograph", "for_loop", "Builder", "optimize(memory="):
        assert what in tour
    assert tour.count("  OK") == 6 and "MISMATCH" not in tour


def test_entry_point_installed():
    exe = os.path.join(os.path.dirname(sys.executable), "jaxform")
    if not os.path.exists(exe):
        pytest.skip("the `jaxform` script is not installed (pip install -e .)")
    r = subprocess.run([exe, "passes"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "fuse_scan_reductions" in r.stdout


@pytest.mark.slow
def test_demo_full_size_subprocess():
    r = jaxform_cmd("demo", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "fuse_scan_reductions" in r.stdout and r.stdout.rstrip().endswith("OK")
    assert "measuring" in r.stderr
