"""The pictures of docs/explorer.md (and the README's), made from a trained run:

    python docs/make_screenshots.py runs/tour

The heatmaps (cross-attention, and the decoder's masked self-attention) are drawn by
``seq2seq attention``; the explorer page it writes
(``-o explorer.html``) and the page ``seq2seq serve`` answers (served here on a free port of
127.0.0.1) are photographed in headless Chromium: Debian's ``/usr/bin/chromium`` driven by
Playwright (``apt-get install chromium``; the dev extra installs Playwright, which downloads no
browser).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import threading
import urllib.parse
from pathlib import Path

from seq2seq.commands.cli import main as seq2seq

SENTENCE = "Ein Mann fährt Fahrrad auf der Straße."
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update",
]  # fmt: skip
WIDTH = 1200
# Explorer views, as the page's URL hash names them (a step is numbered from 1); the whole
# page, or (a tuple) one element of it.
VIEWS = {
    "explorer_step.png": "view=step&step=3",
    "explorer_lines.png": "view=lines&step=3",
    "explorer_attention.png": ("view=heatmap&map=attention&step=11", "#view-heatmap"),
    "explorer_influence.png": ("view=heatmap&map=influence&step=11", "#view-heatmap"),
    "explorer_self_attention.png": ("view=heatmap&kind=decoder&step=11", "#view-heatmap"),
}
# The beam search's tree of the same sentence, a page written with --beam TREE_BEAM.
TREE = "explorer_tree.png"
TREE_BEAM = 4
SERVED = "serve_ban_eos.png"  # the served page with EOS banned, at its last step: max_len
SERVED_FORM = {"text": SENTENCE, "max_len": "16", "ban_eos": "on"}
SERVED_VIEW = "view=step&step=16"
# The served page's interventions panel after a click on a source word: hidden from every
# layer's cross-attention, the sentence decoded again.
INTERVENED = "serve_intervention.png"
INTERVENED_WORD = "\u2581der"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, metavar="RUN_DIR", help="a trained run, e.g. runs/tour")
    p.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent,
        help="where the pictures go (default: docs/)",
    )
    return p.parse_args()


def attention(run: Path, *args: str) -> None:
    """``seq2seq attention RUN SENTENCE ARGS``, its tables of numbers unprinted."""
    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        failed = seq2seq(["attention", str(run), SENTENCE, "--device", "cpu", *args])
    if failed:
        raise SystemExit(f"seq2seq attention failed on {run}:\n{log.getvalue()}")


def heatmaps(run: Path, out: Path) -> list[Path]:
    """The head mean of every layer, the grid of every head, and the decoder's masked
    self-attention in layer 1."""
    mean, grid = out / "attention_mean.png", out / "attention_grid.png"
    decoder = out / "attention_decoder.png"
    attention(run, "-o", str(mean))
    attention(run, "--layer", "all", "--head", "all", "-o", str(grid))
    attention(run, "--kind", "decoder", "--layer", "1", "-o", str(decoder))
    return [mean, grid, decoder]


def screenshots(run: Path, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    from seq2seq.decoding.translate import Translator
    from seq2seq.explorer.serve import make_server

    made = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        page_file = Path(tmp) / "explorer.html"
        attention(run, "-o", str(page_file))
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for name, view in VIEWS.items():
                view, element = view if isinstance(view, tuple) else (view, None)
                url = f"{page_file.as_uri()}#{view}"
                made.append(_photograph(browser, url, out / name, element))
            tree_file = Path(tmp) / "tree.html"
            attention(run, "--beam", str(TREE_BEAM), "--no-interventions", "-o", str(tree_file))
            url = f"{tree_file.as_uri()}#view=tree"
            made.append(_photograph(browser, url, out / TREE, "#view-tree"))
            server = make_server(Translator.from_run(run, "cpu"), "127.0.0.1", 0)
            server.RequestHandlerClass.log_message = lambda *_: None  # no request log
            threading.Thread(target=server.serve_forever, daemon=True).start()
            try:
                port = server.server_address[1]
                query = urllib.parse.urlencode(SERVED_FORM)
                url = f"http://127.0.0.1:{port}/?{query}#{SERVED_VIEW}"
                made.append(_photograph(browser, url, out / SERVED))
                query = urllib.parse.urlencode({"text": SENTENCE, "influence": "on"})
                url = f"http://127.0.0.1:{port}/?{query}#view=interventions"
                made.append(_photograph(browser, url, out / INTERVENED, click=INTERVENED_WORD))
            finally:
                server.shutdown()
                server.server_close()
        finally:
            browser.close()
    return made


def _photograph(
    browser, url: str, png: Path, element: str | None = None, click: str | None = None
) -> Path:
    """The page at ``url`` (or one ``element`` of it), after a click on the source word
    ``click`` in the interventions panel, if given, has been answered."""
    page = browser.new_page(viewport={"width": WIDTH, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    if page.get_attribute("body", "data-status") != "ok" or errors:
        raise SystemExit(f"the page at {url} did not load: {errors}")
    if click is not None:
        page.locator("#mask-words button", has_text=click).first.click()
        page.wait_for_selector("body[data-intervention=ok]", timeout=60_000)
    if element is None:
        page.screenshot(path=str(png), full_page=True)
    else:
        page.locator(element).screenshot(path=str(png))
    page.close()
    return png


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for png in [*heatmaps(args.run, args.out), *screenshots(args.run, args.out)]:
        print(f"wrote {png.name}")


if __name__ == "__main__":
    main()
