"""The chat page's Markdown renderer (static/markdown.js, run in Node with a
KaTeX stand-in that returns HTML with quotes, like the real one): TeX inside a link URL never
reaches the href, and a run of "[" renders in linear time."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from resin.server.misc import STATIC

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="no node")

HARNESS = """
globalThis.window = {};
globalThis.katex = { renderToString: (t) => '<span class="katex" data-x="q">' + t + '</span>' };
require(process.argv[1]);
const inputs = JSON.parse(require("fs").readFileSync(0, "utf8"));
const out = inputs.map((s) => { const t0 = Date.now(); const html = window.renderMarkdown(s);
  return { html, ms: Date.now() - t0 }; });
process.stdout.write(JSON.stringify(out));
"""


def render(*inputs: str) -> list[dict[str, object]]:
    assert NODE is not None
    script = Path(STATIC) / "markdown.js"
    proc = subprocess.run(
        [NODE, "-e", HARNESS, str(script)],
        input=json.dumps(list(inputs)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: list[dict[str, object]] = json.loads(proc.stdout)
    return result


def test_tex_in_a_link_url_stays_out_of_the_href() -> None:
    cases = [
        "[go](https://example.com/$x$)",
        "[go](https://example.com/\\(x\\)) and $y$",
        "[go](https://example.com/`code`)",
    ]
    for out in render(*cases):
        html = str(out["html"])
        for tag in html.split("<a ")[1:]:
            head = tag.split(">", 1)[0]
            assert 'rel="noopener noreferrer"' in head, html
            href = head.split('href="', 1)[1].split('"', 1)[0]
            assert "<" not in href and "katex" not in href, html


def test_links_and_math_still_render() -> None:
    (out,) = render("see [docs](https://a.example/x) for $e^x$ and \\(y\\)")
    html = str(out["html"])
    assert (
        '<a href="https://a.example/x" target="_blank" rel="noopener noreferrer">docs</a>' in html
    )
    assert html.count('class="katex"') == 2


def test_runs_of_brackets_and_openers_render_in_linear_time() -> None:
    # Complexity guard, not a speed target: quadratic scanning took ~2 s on 32k "[" (and
    # grows 4x per doubling); linear scanning takes milliseconds. Compare 64k with 16k.
    t0 = time.perf_counter()
    small, big = render("[" * 16_000 + "](", "[" * 64_000 + "](")
    assert time.perf_counter() - t0 < 30
    assert int(str(big["ms"])) < 16 * max(50, int(str(small["ms"]))), (small["ms"], big["ms"])
    assert int(str(big["ms"])) < 3000, big["ms"]
    (opened,) = render("\\(" * 32_000)
    assert int(str(opened["ms"])) < 3000, opened["ms"]
