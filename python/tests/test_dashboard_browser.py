"""The dashboard in a real browser: headless Chromium (scripts/setup-chromium.sh; the test is
skipped where there is none and SIPHON_REQUIRE_BROWSER is unset) opens the index and latent
pages from disk, with no server and no network. The pages' scripts run without a console
error, and the DOM they build holds the run's stored latents: every highlighted token's value
is the latent's value at that token (the hand-written run's truth), the top examples are the
latent's largest values, the table lists every latent. A latent that never fired says so
(no histogram, no empty ranges), an address that names no latent says which, and every axis
label of every histogram lies inside its SVG (measured by the browser's layout)."""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from siphon.dashboard import build_dashboard

from latent_runs import SAE
from test_dashboard import NASTY, WIDTH, crafted, truth_top, write_effects


def chromium() -> str:
    found = os.environ.get("SIPHON_CHROMIUM") or next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    if found is None:
        if os.environ.get("SIPHON_REQUIRE_BROWSER"):
            pytest.fail("no chromium (scripts/setup-chromium.sh installs Debian's)")
        pytest.skip("no chromium on PATH")
    return found


def open_page(page: Path, fragment: str = "") -> Tuple[str, str]:
    """The DOM after the page's scripts ran, and the browser's console log."""
    done = subprocess.run(
        [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri() + fragment],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def console_errors(log: str) -> List[str]:
    return [line for line in log.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "Error" in line)]


class Tokens(html.parser.HTMLParser):
    """Each `div.example`'s value and its `span.tok`s' (value, own) in order."""

    def __init__(self) -> None:
        super().__init__()
        self.examples: List[Dict[str, Any]] = []
        self.rows: List[str] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "div" and "example" in classes:
            self.examples.append({"value": float(a["data-value"] or 0), "row": int(a["data-row"] or 0), "tokens": []})
        elif tag == "span" and "tok" in classes and self.examples:
            self.examples[-1]["tokens"].append((float(a["data-value"] or 0), "own" in classes))
        elif tag == "tr" and a.get("data-latent") is not None:
            self.rows.append(a["data-latent"] or "")


def shown(dom: str) -> str:
    """What a latent page's script drew (its `main`), without the page's own script text."""
    found = re.search(r'<main id="latent">(.*?)</main>', dom, re.S)
    assert found, dom[-2000:]
    return found.group(1)


def add_logits_histograms(path: Path) -> None:
    """Adds each latent's logit histogram to an effects file: counts up to millions (a wide
    label on the y axis) between ends with five significant digits (wide labels on the x
    axis, the last at the SVG's right edge)."""
    tensors = load_file(str(path))
    rng = np.random.default_rng(4)
    tensors["logits_hist_heights"] = rng.integers(0, 2_345_678, (WIDTH, 20)).astype(np.int32)
    tensors["logits_hist_range"] = np.tile(np.array([-0.123456, 0.987654], np.float32), (WIDTH, 1))
    save_file(tensors, str(path))


#: Appended to a copy of a page: once its script drew the SVGs, each axis label's box against
#: its SVG's box, from the browser's layout, as JSON in ``<pre id="measured">``.
MEASURE = """<script>
(function () {
  function measure() {
    var svgs = document.querySelectorAll("svg");
    if (!svgs.length) { setTimeout(measure, 50); return; }
    var out = [];
    for (var i = 0; i < svgs.length; i++) {
      var box = svgs[i].getBoundingClientRect(), texts = svgs[i].querySelectorAll("text");
      for (var j = 0; j < texts.length; j++) {
        var r = texts[j].getBoundingClientRect();
        out.push({svg: svgs[i].id, text: texts[j].textContent, box: [box.left, box.top, box.right, box.bottom],
                  label: [r.left, r.top, r.right, r.bottom]});
      }
    }
    var pre = document.createElement("pre");
    pre.id = "measured";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  setTimeout(measure, 100);
})();
</script>
"""


def measured(page: Path, fragment: str = "") -> List[Dict[str, Any]]:
    """Each axis label of `page` (at `fragment`) with its box and its SVG's, as the browser
    lays them out."""
    copy = page.with_name(page.stem + "-measured.html")
    copy.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    dom, log = open_page(copy, fragment)
    assert not console_errors(log), console_errors(log)
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, "the page drew no SVG"
    labels: List[Dict[str, Any]] = json.loads(html.unescape(found.group(1)))
    return labels


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Any, Path]:
    root = tmp_path_factory.mktemp("browser")
    truth = crafted(root / "run", hosts=1)
    vocab = [f"t{i}" for i in range(256)]
    for i, s in NASTY.items():
        vocab[i] = s
    write_effects(root / "effects", vocab)
    add_logits_histograms(root / "effects" / f"{SAE}.safetensors")
    build_dashboard(truth.path, root / "site", effects=root / "effects", top=4, quantiles=2, per_quantile=2,
                    window=2, progress=False)
    return truth, root / "site"


def test_the_index_lists_every_latent(site: Tuple[Any, Path]) -> None:
    _, out = site
    dom, log = open_page(out / SAE / "index.html")
    assert not console_errors(log), console_errors(log)
    parsed = Tokens()
    parsed.feed(dom)
    assert sorted(int(r) for r in parsed.rows) == list(range(WIDTH))
    top, log = open_page(out / "index.html")
    assert not console_errors(log) and SAE in top


@pytest.mark.parametrize("latent", [1, 3, WIDTH - 1])
def test_a_latent_page_shows_its_stored_values(site: Tuple[Any, Path], latent: int) -> None:
    truth, out = site
    dom, log = open_page(out / SAE / "latent.html", f"#{latent}")
    assert not console_errors(log), console_errors(log)
    assert f'data-latent="{latent}"' in dom
    parsed = Tokens()
    parsed.feed(dom)
    dense = truth.dense[SAE][:, latent]
    if dense[truth.mask].max(initial=0) <= 0:
        assert parsed.examples == []  # a latent that never fired has no examples
        return
    assert parsed.examples
    want_top = [v for v, _ in truth_top(truth, latent, 4)]
    assert [e["value"] for e in parsed.examples[: len(want_top)]] == pytest.approx(want_top, rel=1e-4)
    for example in parsed.examples:
        row = example["row"]
        own = [v for v, is_own in example["tokens"] if is_own]
        assert own == pytest.approx([dense[row]], rel=1e-4)
        # Every highlighted token's value is the latent's stored value at its row: the window
        # lies within the example's sequence, whose rows are consecutive in this run.
        seq = row // truth.seq_len
        centre = [i for i, (_, is_own) in enumerate(example["tokens"]) if is_own][0]
        for i, (value, _) in enumerate(example["tokens"]):
            at = row + i - centre
            assert at // truth.seq_len == seq
            assert value == pytest.approx(float(dense[at]), rel=1e-4, abs=1e-6)


def test_a_latent_that_never_fired_says_so(site: Tuple[Any, Path]) -> None:
    truth, out = site
    never = WIDTH - 1
    assert truth.dense[SAE][truth.mask][:, never].max(initial=0) <= 0, "the crafted run's last latent never fires"
    dom, log = open_page(out / SAE / "latent.html", f"#{never}")
    assert not console_errors(log), console_errors(log)
    dom = shown(dom)
    assert f'data-latent="{never}"' in dom
    said = re.search(r'<p id="never-fired">(.*?)</p>', dom, re.S)
    assert said and f"Latent {never} never fired" in said.group(1) and str(int(truth.mask.sum())) in said.group(1)
    # No largest or mean value, no histogram, no top or range sections: nothing that looks like data.
    for absent in ('id="histogram"', 'class="range"', 'id="top"', 'data-key="max"', 'data-key="mean"', ">none<"):
        assert absent not in dom, absent
    # Its decoder's effects are still shown.
    assert 'id="logits-histogram"' in dom and 'id="neighbours"' in dom
    # A latent that fired shows them, its mean named as over its firings.
    fired = shown(open_page(out / SAE / "latent.html", "#3")[0])
    assert 'id="histogram"' in fired and "<dt>mean over firings</dt>" in fired and 'id="never-fired"' not in fired
    # The index shows no max or mean for it either.
    index, _ = open_page(out / SAE / "index.html")
    row = re.search(rf'<tr data-latent="{never}">(.*?)</tr>', index, re.S)
    assert row
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    assert cells[2] == cells[3] == "\u2013" and cells[4] == "0", cells
    assert "mean over firings" in index


@pytest.mark.parametrize("fragment, named", [("#abc", "abc"), ("#12abc", "12abc"), ("#-1", "-1"), ("#3.5", "3.5"),
                                             ("#%3Cb%3E", "<b>"), (f"#{WIDTH}", str(WIDTH))])
def test_an_address_that_names_no_latent_says_so(site: Tuple[Any, Path], fragment: str, named: str) -> None:
    _, out = site
    dom, log = open_page(out / SAE / "latent.html", fragment)
    assert not console_errors(log), console_errors(log)
    status = re.search(r'<p id="status">(.*?)</p>', dom, re.S)
    assert status and html.unescape(status.group(1)) == f"no latent {named} (latents are 0..{WIDTH - 1})"
    assert shown(dom) == "", "no latent's page is shown"
    assert "<b>" not in dom


@pytest.mark.parametrize("page, fragment", [("latent.html", "#3"), ("latent.html", f"#{WIDTH - 1}"),
                                            ("index.html", "")])
def test_every_axis_label_lies_inside_its_svg(site: Tuple[Any, Path], page: str, fragment: str) -> None:
    _, out = site
    labels = measured(out / SAE / page, fragment)
    svgs = {label["svg"] for label in labels}
    want = {"latent.html#3": {"histogram", "logits-histogram"}, f"latent.html#{WIDTH - 1}": {"logits-histogram"},
            "index.html": {"frequency-histogram"}}[page + fragment]
    assert svgs == want
    for label in labels:
        (left, top, right, bottom), (x0, y0, x1, y1) = label["box"], label["label"]
        assert x1 > x0 and y1 > y0, label
        assert left <= x0 and x1 <= right and top <= y0 and y1 <= bottom, f"{label['text']!r} leaves its SVG: {label}"
    # The x axis ends at the histogram's last edge, the y axis at its largest count.
    if page == "latent.html":
        logits = [label["text"] for label in labels if label["svg"] == "logits-histogram"]
        assert "0.98765" in logits and any(len(t) == 7 and t.isdigit() for t in logits), logits
