"""The HTML report of a real build, opened in headless Chromium: it renders, its script
runs without an error and sorts the table, it loads nothing from outside, and its
screenshot shows the charts.

Skipped, with the reason, where no Chromium is installed (Debian: `apt-get install -y
chromium`; `.ci/run` installs it).
"""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np
import onnx
import pytest
from PIL import Image

import wpk
from tests.browser import dump_dom, find_chromium, screenshot
from tests.models import tiny_conv_gemm
from wpk.cli import main

BROWSER = find_chromium()
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium here (Debian: apt-get "
                                                        "install -y chromium)")
KIND_BLUE = (0x3B, 0x7D, 0xD8)   # vendor bars
CURVE_GREEN = (0x2E, 0x9D, 0x5B)


class Dom(HTMLParser):
    """The workloads table (header order and aria-sort, each row's median) and the external
    resources (src / href / link) of a serialized DOM."""

    def __init__(self, text: str):
        super().__init__()
        self.heads, self.sorted, self.medians, self.external, self.svgs = [], {}, [], [], 0
        self._in_table = False
        self._column = -1
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.external += [f"{tag} {k}" for k in ("src", "href") if attrs.get(k)]
        self.svgs += tag == "svg"
        if tag == "table" and "workloads" in (attrs.get("class") or ""):
            self._in_table = True
        if not self._in_table:
            return
        if tag == "th":
            self.heads.append(attrs.get("data-name"))
            if attrs.get("aria-sort"):
                self.sorted[attrs["data-name"]] = attrs["aria-sort"]
        if tag == "tr":
            self._column = -1
        if tag == "td":
            self._column += 1
            if self._column == self.heads.index("median"):
                self.medians.append(float(attrs["data-v"]))

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_table = False


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A tuned build's report as an HTML file (through `wpk report --format html`)."""
    folder = tmp_path_factory.mktemp("browser")
    model = folder / "tiny.onnx"
    onnx.save(tiny_conv_gemm(), str(model))
    plan = folder / "tiny.wpk"
    wpk.build(str(model), target="cpu", output=str(plan), search="random", trials=4,
              progress=False, warmup=1, repeats=3, min_time=0.0)
    html_path = folder / "report.html"
    assert main(["report", str(plan), "--format", "html", "-o", str(html_path)]) == 0
    return html_path


def test_the_page_runs_its_script_and_sorts_in_a_browser(page, tmp_path):
    dom_text, console = dump_dom(BROWSER, page, "#sort=-median", tmp_path)
    assert not [line for line in console if "Uncaught" in line or "rror" in line], console
    dom = Dom(dom_text)
    assert dom.sorted == {"median": "descending"}
    assert dom.medians == sorted(dom.medians, reverse=True) and len(dom.medians) == 4
    assert dom.external == []                 # nothing to fetch: self-contained
    assert dom.svgs >= 4 + 4 + 3             # summary charts, cards, tuning curves
    ascending = Dom(dump_dom(BROWSER, page, "#sort=median", tmp_path)[0])
    assert ascending.medians == sorted(dom.medians)


def test_the_screenshot_shows_the_charts(page, tmp_path):
    png = tmp_path / "report.png"
    screenshot(BROWSER, page, png, tmp_path, width=1280, height=3600)
    image = np.asarray(Image.open(png).convert("RGB"))
    assert image.shape == (3600, 1280, 3)
    colors = {tuple(c) for c in image.reshape(-1, 3)[::7]}
    assert len(colors) > 50                   # text and charts, not a blank page

    def near(rgb, tolerance=12):
        return np.all(np.abs(image.astype(int) - np.array(rgb)) <= tolerance, axis=-1)
    assert near(KIND_BLUE).sum() > 2000       # the vendor bars are drawn
    assert near(CURVE_GREEN).sum() > 100      # the tuning curves (2 px lines) and markers
