"""docs/tour.ipynb: made from docs/tour.md (one source), executed end to end in a real kernel
(nbclient, ipykernel) with fewer training steps than the tour's, then converted to HTML
(nbconvert) and opened in Chromium: its two explorers step and toggle on their own, and the
page fetches nothing. Skipped, saying why, without the notebook extra (``pip install -e
.[notebook]``)."""

import importlib.util
import shutil
from pathlib import Path

import pytest
from browser import chromium

nbformat = pytest.importorskip("nbformat", reason="pip install -e .[notebook]")
nbclient = pytest.importorskip("nbclient", reason="pip install -e .[notebook]")
nbconvert = pytest.importorskip("nbconvert", reason="pip install -e .[notebook]")

REPO = Path(__file__).resolve().parents[1]
STEPS = 60  # the tour trains 400; the cells need a model, not a good one


def maker():
    spec = importlib.util.spec_from_file_location("make_tour", REPO / "docs/make_tour_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_notebook_is_the_pages_without_outputs():
    made = maker().tour_notebook((REPO / "docs/tour.md").read_text(encoding="utf-8"))
    committed = nbformat.read(REPO / "docs/tour.ipynb", as_version=4)
    assert committed == made, (
        "docs/tour.ipynb is not docs/tour.md's: python docs/make_tour_notebook.py"
    )
    assert all(not c.get("outputs") for c in committed.cells)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkout")
    shutil.copytree(REPO / "docs", folder / "docs", ignore=shutil.ignore_patterns("*.png"))
    for name in ("data", "experiments"):
        (folder / name).symlink_to(REPO / name, target_is_directory=True)
    notebook = nbformat.read(folder / "docs/tour.ipynb", as_version=4)
    (parameters,) = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    parameters.source = f'SET = ["train.max_steps={STEPS}"]'
    client = nbclient.NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": folder / "docs"}},
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
    return notebook


def outputs(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []))


def test_the_notebook_trains_translates_and_shows_explorers(executed):
    code = [c for c in executed.cells if c.cell_type == "code"]
    (train,) = [c for c in code if "seq2seq.train(" in c.source]
    assert f"stopped: max_steps {STEPS}" in outputs(train)
    explorers = [
        o
        for c in code
        for o in c.get("outputs", [])
        if "<iframe srcdoc=" in o.get("data", {}).get("text/html", "")
    ]
    assert len(explorers) == 2


def test_the_html_notebook_runs_two_explorers_apart_and_fetches_nothing(executed, tmp_path):
    body, _ = nbconvert.HTMLExporter(template_name="basic").from_notebook_node(executed)
    page_file = tmp_path / "tour.html"
    page_file.write_text(f"<!DOCTYPE html><html><body>{body}</body></html>", encoding="utf-8")
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        requests, errors = [], []
        page.on("request", lambda r: requests.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(page_file.as_uri())
        frames = [f for f in page.frames if f != page.main_frame]
        assert len(frames) == 2
        for frame in frames:
            frame.wait_for_function("document.body.dataset.status !== 'loading'")
            assert frame.evaluate("document.body.dataset.status") == "ok", errors

        def shown(key: str) -> list[str]:
            return [f.evaluate(f"document.body.dataset.{key}") for f in frames]

        first, second = frames
        first.click("#next")
        assert shown("step") == ["2", "1"]
        second.click("#next")
        second.click("#next")
        assert shown("step") == ["2", "3"]
        for frame in frames:
            frame.click(".tabs button[data-view=heatmap]")
        second.click(".toggle button[data-map=influence]")
        assert shown("map") == ["attention", "influence"]
        first.click(".toggle button[data-map=influence]")
        assert shown("map") == ["influence", "influence"]
        # the page and the pictures of its markdown, beside it: nothing from a network
        assert [url for url in requests if not url.startswith("file:///")] == [] and not errors
