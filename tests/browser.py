"""Shared by the explorer tests: a small run that stops at EOS, and headless Chromium.

Chromium is Debian's (``apt-get install chromium``), driven by Playwright from PyPI; no
browser is downloaded. Tests that need it skip, saying why, where either is missing.
"""

import contextlib
import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import train_sample_run

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update",
]  # fmt: skip
N_LAYERS, N_HEADS = 2, 4


def explorer_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1+2-layer model trained on data/sample long enough (300 steps, a few seconds) to
    write non-empty outputs that stop at EOS; once per test session."""
    run = tmp_path_factory.getbasetemp() / "explorer_run"
    with contextlib.redirect_stdout(io.StringIO()):
        return train_sample_run(run, steps=300, validate_every=300, lr=3e-3, n_dec_layers=N_LAYERS)


@contextlib.contextmanager
def chromium() -> Iterator:
    """A headless Chromium browser (Playwright), closed on exit."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    if shutil.which(CHROMIUM) is None:
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser, url: str, width: int = 1200):
    """A new page at ``url`` that fails the test on any script error."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    assert page.get_attribute("body", "data-status") == "ok", errors
    return page


def not_blank(png: Path) -> bool:
    """True when a screenshot has more than a handful of colours (a blank page has one)."""
    from PIL import Image

    with Image.open(png) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    return colours is None or len(colours) > 20
