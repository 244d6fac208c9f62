"""The dashboard in a real browser: headless Chromium (scripts/setup-chromium.sh; the test is
skipped where there is none and SIPHON_REQUIRE_BROWSER is unset) opens the index and latent
pages from disk, with no server and no network. The pages' scripts run without a console
error, and the DOM they build holds the run's stored latents: every highlighted token's value
is the latent's value at that token (the hand-written run's truth), the top examples are the
latent's largest values, the table lists every latent."""

from __future__ import annotations

import html.parser
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Any, Path]:
    root = tmp_path_factory.mktemp("browser")
    truth = crafted(root / "run", hosts=1)
    vocab = [f"t{i}" for i in range(256)]
    for i, s in NASTY.items():
        vocab[i] = s
    write_effects(root / "effects", vocab)
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
