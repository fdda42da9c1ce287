"""draw: HTML (own layout, no Graphviz) and Graphviz SVG; bodies as clusters, changes highlighted."""
import os
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib

import jax.numpy as jnp
import pytest

import jaxform
from jaxform.inspect import DrawError
from jaxform.inspect.layout import STYLE
from programs import mse, nested, rnn_args, twice

NEW_FILL, REMOVED_FILL = STYLE["new"][0], STYLE["removed"][0]
has_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")


def test_html_page_is_self_contained_and_marks_changes(tmp_path):
    path = jaxform.draw(mse, *rnn_args(), path=tmp_path / "flagship.html")
    page = open(path).read()
    assert path.endswith("flagship.html") and page.startswith("<!doctype html>")
    assert page.count("<svg") == 2 and "<script" not in page and not re.search(r"(src|href)=", page)
    # the flagship: sub, integer_pow, reduce_sum over [L, B, H] leave the outer program (red); new (orange):
    # their per-step versions and the accumulating add in the body, the accumulator's init and the changed scan.
    # (The final div by the count stays, rewired to the new scan result: neither.)
    assert page.count('class="node removed"') == 3
    assert page.count('class="node new"') == 6
    assert ">body</text>" in page                  # the scan body is drawn as a nested cluster
    assert "fuse_scan_reductions" in page and "num_carry=2" in page   # summary and the text diff


def test_unchanged_program_has_no_highlights(tmp_path):
    page = open(jaxform.draw(twice, jnp.ones(3), path=tmp_path / "x.html", passes=["dce"])).read()
    assert 'class="node new"' not in page and 'class="node removed"' not in page
    assert "(no change)" in page


def test_builtin_svg_is_valid_xml(tmp_path):
    path = jaxform.draw(nested, jnp.ones(3), jnp.ones((5, 3)), path=tmp_path / "n.svg", passes=["cse"],
                        engine="builtin")
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    text = ET.tostring(root, encoding="unicode")
    assert "branches[1]" in text and text.count(f'fill="{REMOVED_FILL}"') >= 1


@has_dot
def test_graphviz_svg_has_clusters_and_highlights(tmp_path):
    path = jaxform.draw(mse, *rnn_args(), path=tmp_path / "flagship.svg")
    root = ET.parse(path).getroot()
    text = ET.tostring(root, encoding="unicode")
    titles = re.findall(r"<ns0:title>(cluster_[^<]*)</ns0:title>", text)
    assert {"cluster_b", "cluster_a"} <= set(titles) and len(titles) == 4   # before/after + a scan body in each
    assert text.count(f'fill="{NEW_FILL}"') == 6 and text.count(f'fill="{REMOVED_FILL}"') == 3


@has_dot
def test_graphviz_png(tmp_path):
    path = jaxform.draw(twice, jnp.ones(3), path=tmp_path / "t.png", passes=["cse"])
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_errors(tmp_path, monkeypatch):
    with pytest.raises(DrawError, match=r"\.html, \.svg"):
        jaxform.draw(twice, jnp.ones(3), path=tmp_path / "x.txt")
    with pytest.raises(DrawError, match="builtin engine writes .html or .svg"):
        jaxform.draw(twice, jnp.ones(3), path=tmp_path / "x.png", engine="builtin")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(DrawError, match="needs Graphviz's `dot`.*apt-get install graphviz.*html"):
        jaxform.draw(twice, jnp.ones(3), path=tmp_path / "x.svg")
    assert not os.path.exists(tmp_path / "x.svg")


# ---- rendered in a real browser ------------------------------------------------------------

def read_png(path):
    """(width, height, rows of RGB(A) tuples) of an 8-bit RGB/RGBA PNG, as Chromium writes them."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert depth == 8 and color in (2, 6), (depth, color)
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a, b, c = line[i - bpp] if i >= bpp else 0, prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(w)])
        prev = line
    return w, h, rows


@pytest.mark.browser
@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless Chromium is not installed")
def test_html_renders_in_chromium(tmp_path):
    page = jaxform.draw(mse, *rnn_args(), path=tmp_path / "flagship.html")
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                    "--window-size=1200,900", f"file://{page}"], check=True, capture_output=True, timeout=120)
    w, h, rows = read_png(shot)
    assert (w, h) == (1200, 900)
    pixels = [p for row in rows for p in row]
    non_white = sum(p != (255, 255, 255) for p in pixels)
    assert non_white > 0.05 * len(pixels)           # the page drew something substantial
    hexrgb = lambda s: tuple(int(s[i:i + 2], 16) for i in (1, 3, 5))  # noqa: E731
    near = lambda p, q: all(abs(x - y) <= 6 for x, y in zip(p, q))    # noqa: E731
    # both highlight colours are on screen: new nodes (orange) and removed ones (red)
    assert sum(near(p, hexrgb(NEW_FILL)) for p in pixels) > 500
    assert sum(near(p, hexrgb(REMOVED_FILL)) for p in pixels) > 500
