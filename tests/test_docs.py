"""Every command and code block of README.md, docs/*.md and data/README.md runs in a test, on
one tiny model, so the documentation cannot drift from the code.

The tiny model is the tour's own: the first command of docs/tour.md (``seq2seq train --config
docs/tour.yaml --out runs/tour``, seconds) trains it once per session. Each page then runs, block
by block and in order, in a scratch folder laid out like a checkout: ``docs/`` copied, ``data/``
and ``experiments/`` linked, ``runs/tour`` a copy of that model and ``runs/de-en``, ``runs/en-de``
links to it, so that commands written for the 30-minute model run as they stand.

- ```bash: one command per line (a trailing ``\\`` continues it, ``#`` starts a comment).
  ``seq2seq ...`` runs in this process and must exit 0, except that ``seq2seq train`` (also under
  ``torchrun``), whose budgets run to 30 minutes, resolves and checks its whole configuration
  (flags, ``--config``, every ``--set``) and stops before training; a ``--data`` naming a Hub
  dataset is parsed only (no network); ``seq2seq serve`` binds a free port in place of the one
  written, answers one request and stops. ``python`` scripts and modules of ``experiments/`` are
  parsed only (their argparse runs, then they stop); ``python docs/make_screenshots.py`` runs.
  ``pip install`` and ``python -m pytest`` must be what ``.ci/run`` runs (or a declared extra, an
  existing test file). A line with a pipe or a redirection, and a few file tools, run in bash.
  Anything else fails: a new kind of command needs a rule here.
- ```python: runs as a script, in a namespace of its own.
- ```yaml: a config file, checked as ``--config`` checks one.
- ```text, right after a bash or python block: what its last command printed, stdout and stderr
  together as a terminal shows them. ``…`` alone on a line stands for any lines, inside a line
  for any text; a number with a decimal point matches within 0.5% or two units of its last digit
  (another CPU's rounding); every other character must match.
- Any other block fails the test: nothing in the docs goes unchecked.

Some pages are also checked for what their blocks leave behind (``AFTER``): the Python API's
example writes readable figures and its hypotheses; docs/explorer.md's command makes every picture
the page shows (where Chromium is installed); docs/training.md's config block, which says it
shows the defaults, shows them.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import http.client
import io
import json
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import threading
import urllib.parse
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import matplotlib.image
import pytest
from helpers import child_env

from seq2seq.commands.cli import build_parser, main
from seq2seq.config import Config, config_from_dict, given_values

REPO = Path(__file__).resolve().parents[1]
# Written by `python -m experiments.records render` from the records; tests/test_records.py
# checks it, and its commands are templates (`seq2seq train … --out runs/NAME`).
GENERATED = {"docs/results.md"}
DOCS = sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))
PAGES = ["README.md", *(page for page in DOCS if page not in GENERATED), "data/README.md"]
TOUR = "docs/tour.md"
TOUR_TRAIN = "seq2seq train --config docs/tour.yaml --out runs/tour"
RUN_LINKS = ("de-en", "en-de")  # the README's and the docs' trained runs, played by runs/tour
SHELL_TOOLS = {"paste", "head", "ls", "cat", "wc", "cut", "sha256sum"}
SCREENSHOTS = "docs/make_screenshots.py"
ELLIPSIS = "…"
TOLERANCE = 0.005  # relative, for a number with a decimal point: another CPU's rounding
_FENCE = re.compile(r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)
_DECIMAL = r"(?<![\d.])-?\d+\.\d+(?:[eE][-+]?\d+)?(?![\d.])"
_INLINE = re.compile(f"({ELLIPSIS}|{_DECIMAL})")
_NUMBER = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SHELL_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "&"}


@dataclass
class Block:
    page: str
    line: int  # of the opening fence
    lang: str
    body: str
    after_block: bool  # nothing but blank lines between this block and the one before

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    text = (REPO / page).read_text(encoding="utf-8")
    found, end = [], None
    for m in _FENCE.finditer(text):
        gap = text[end : m.start()] if end is not None else "x"
        line = text.count("\n", 0, m.start()) + 1
        found.append(Block(page, line, m["lang"], m["body"], not gap.strip()))
        end = m.end()
    return found


def commands(body: str) -> list[str]:
    """The command lines of a bash block: continuations joined, comments and blanks dropped."""
    lines = body.replace("\\\n", " ").splitlines()
    kept = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return [" ".join(line.split()) for line in kept]


def terminal(text: str) -> str:
    """``text`` as a terminal leaves it: a carriage return (a progress bar) rewrites its line."""
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]
    return "\n".join(line for line in lines if line).strip("\n")


def output_matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` is what ``expected`` shows: see the module's docstring."""
    parts, numbers = [], []
    for line in expected.strip("\n").splitlines():
        if line.strip() == ELLIPSIS:
            parts.append(r"(?:[^\n]*\n)*?")
            continue
        pieces = []
        for i, piece in enumerate(_INLINE.split(line.rstrip())):
            if i % 2 == 0:
                pieces.append(re.escape(piece))
            elif piece == ELLIPSIS:
                pieces.append(r"[^\n]*?")
            else:
                pieces.append(_NUMBER)
                numbers.append(piece)
        parts.append("".join(pieces) + r"\n")
    found = re.fullmatch("".join(parts), actual + "\n")
    if not found:
        return False
    for shown, got in zip(numbers, found.groups(), strict=True):
        digits = len(shown.split(".")[1].split("e")[0].split("E")[0])
        allowed = max(TOLERANCE * abs(float(shown)), 2 * 10.0**-digits)
        if abs(float(got) - float(shown)) > allowed * (1 + 1e-9):  # two units: 3.05 to 3.07 too
            return False
    return True


@contextlib.contextmanager
def captured() -> Iterator[io.StringIO]:
    """stdout and stderr into one buffer, in the order they were written."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        yield buffer


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@dataclass
class Tour:
    run: Path  # the tiny model, trained by the tour's first command
    output: str  # what that command printed


@pytest.fixture(scope="session")
def tour(tmp_path_factory) -> Tour:
    first = next(b for b in blocks(TOUR) if b.lang == "bash")
    assert commands(first.body)[0] == TOUR_TRAIN, f"{TOUR} should begin by training its model"
    folder = tmp_path_factory.mktemp("tour")
    (folder / "docs").mkdir()
    shutil.copy(REPO / "docs" / "tour.yaml", folder / "docs")
    with working_directory(folder), captured() as out:
        status = main(shlex.split(TOUR_TRAIN)[1:])
    assert status == 0, out.getvalue()
    return Tour(folder / "runs" / "tour", terminal(out.getvalue()))


def checkout_like(folder: Path, run: Path) -> Path:
    """A scratch folder where the docs' relative paths mean what they mean in a checkout."""
    # The pictures stay behind: the page that makes them must make them here.
    shutil.copytree(REPO / "docs", folder / "docs", ignore=shutil.ignore_patterns("*.png"))
    for name in ("data", "experiments"):
        (folder / name).symlink_to(REPO / name, target_is_directory=True)
    shutil.copytree(run, folder / "runs" / "tour")
    for name in RUN_LINKS:
        (folder / "runs" / name).symlink_to("tour", target_is_directory=True)
    return folder


@dataclass
class PageRun:
    """Runs one page's blocks in order, keeping each python block's globals and each yaml
    block's values for the checks that follow a page."""

    tour: Tour
    folder: Path
    namespaces: list[dict] = field(default_factory=list)
    configs: list[dict] = field(default_factory=list)  # each yaml block, as given

    def block(self, block: Block) -> str | None:
        """What the block printed (its last command's output), or None for a yaml block."""
        if block.lang == "bash":
            outputs = [self.command(line, block) for line in commands(block.body)]
            assert outputs, f"{block.where}: an empty bash block"
            return outputs[-1]
        if block.lang == "python":
            code = compile("\n" * block.line + block.body, block.page, "exec")
            namespace: dict = {"__name__": "__main__"}
            with captured() as out:
                exec(code, namespace)
            self.namespaces.append(namespace)
            return terminal(out.getvalue())
        if block.lang == "yaml":
            path = self.folder / "block.yaml"
            path.write_text(block.body, encoding="utf-8")
            config_from_dict(given_values(path))
            self.configs.append(given_values(path))
            return None
        pytest.fail(f"{block.where}: a ```{block.lang} block: every block is bash, python, yaml "
                    "or the text output of the block before it")  # fmt: skip

    def command(self, line: str, block: Block) -> str:
        where = f"{block.where}: `{line}`"
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.commenters = "#"
        tokens = list(lexer)
        if _SHELL_OPERATORS & set(tokens):
            return self.bash(line, where)
        argv = shlex.split(line, comments=True)
        while argv and _ENV.match(argv[0]):
            argv.pop(0)
        head = argv[0]
        try:
            if head == "seq2seq":
                return self.seq2seq(argv[1:], line, where)
            if head == "torchrun":
                module = argv.index("-m")
                assert argv[module + 1 : module + 3] == ["seq2seq", "train"], where
                return self.seq2seq(argv[module + 2 :], line, where)
            if head == "pip":
                check_pip(argv, where)
                return ""
            if head == "python":
                return self.python(argv, where)
            if head in SHELL_TOOLS:
                return self.bash(line, where)
        except SystemExit as e:  # argparse refusing a flag, say
            pytest.fail(f"{where} exited with status {e.code}")
        pytest.fail(f"{where}: no rule runs `{head}` (see tests/test_docs.py)")

    def seq2seq(self, argv: list[str], line: str, where: str) -> str:
        if line == TOUR_TRAIN:
            return self.tour.output  # trained once, by the session's fixture
        with captured() as out:
            try:
                args = build_parser().parse_args(argv)
            except SystemExit:
                pytest.fail(f"{where}: {terminal(out.getvalue())}")
        if args.command == "train":
            return self.call(argv, where, train=True)
        if is_hub_id(getattr(args, "data", None)):
            return terminal(out.getvalue())  # parsed: a download has no place in a test
        if args.command == "serve":
            return self.serve(argv, args.run_dir, where)
        return self.call(argv, where)

    def call(self, argv: list[str], where: str, train: bool = False) -> str:
        """``seq2seq ARGV`` in this process; with ``train``, the config is resolved and checked
        (``seq2seq.training.entry.train`` is where training would start)."""
        given = {}

        def resolved(config, run_dir, **_):
            given["config"] = config
            return {"best_bleu": 0.0, "stop_reason": "max_steps"}

        patched = (
            mock.patch("seq2seq.training.entry.train", resolved)
            if train
            else contextlib.nullcontext()
        )
        with patched, captured() as out:
            status = main(argv)
        text = terminal(out.getvalue())
        assert status == 0, f"{where} exited with status {status}:\n{text}"
        assert given or not train, f"{where} never reached training"
        return text

    def serve(self, argv: list[str], run_dir: Path, where: str) -> str:
        """The server as written but on a free port: one request, then it stops. The page must
        hold the translation that ``translate`` gives."""
        written = argv[argv.index("--port") + 1] if "--port" in argv else "8000"
        if "--port" in argv:
            argv = [*argv[: argv.index("--port")], *argv[argv.index("--port") + 2 :]]
        from seq2seq.decoding.translate import Translator
        from seq2seq.explorer.serve import ExplorerServer

        original = ExplorerServer.serve_forever
        answers = []
        sentence = "Ein Hund läuft über die Wiese."
        expected = Translator.from_run(run_dir).translate([sentence])[0][0].text

        def one_request(server, poll_interval=0.5):
            port = server.server_address[1]
            query = urllib.parse.urlencode({"text": sentence})

            def ask():
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                try:
                    connection.request("GET", f"/?{query}")
                    response = connection.getresponse()
                    answers.append((response.status, response.read().decode("utf-8")))
                finally:
                    connection.close()
                    server.shutdown()

            client = threading.Thread(target=ask)
            client.start()
            original(server, poll_interval)
            client.join()
            answers.append(port)

        with mock.patch.object(ExplorerServer, "serve_forever", one_request):
            text = self.call([*argv, "--port", "0"], where)
        (status, page), port = answers
        shown = json.dumps(expected, ensure_ascii=False)  # the page's data is JSON
        assert status == 200 and shown in page, f"{where}: the page lacks {shown}"
        return text.replace(f"127.0.0.1:{port}/", f"127.0.0.1:{written}/")

    def python(self, argv: list[str], where: str) -> str:
        if argv[1:3] == ["-m", "pytest"]:
            check_pytest(argv, where)
            return ""
        module = argv[2] if argv[1] == "-m" else None
        script = None if module else argv[1]
        assert (module or "").startswith("experiments") or (script or "").startswith(
            ("experiments/", "docs/")
        ), f"{where}: only experiments/ and docs/ scripts are run from the docs"
        real = script == SCREENSHOTS and chromium_available()
        sys_argv = [module or script, *argv[(3 if module else 2) :]]
        with captured() as out, mock.patch.object(sys, "argv", sys_argv):
            parsed = run_script(module, script, parse_only=not real)
        assert parsed or real, f"{where} never parsed its arguments"
        return terminal(out.getvalue())

    def bash(self, line: str, where: str) -> str:
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the venv's tools
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=self.folder,
            env=child_env(PATH=path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{where} exited with status {done.returncode}:\n{done.stdout}"
        return terminal(done.stdout)


class _Parsed(Exception):
    """Raised once a script's arguments are parsed, to stop it there."""


def run_script(module: str | None, script: str | None, parse_only: bool) -> bool:
    """Run ``python -m MODULE`` or ``python SCRIPT`` here; with ``parse_only`` stop it when its
    argparse is done. Returns whether it stopped there."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    patched = (
        mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop)
        if parse_only
        else contextlib.nullcontext()
    )
    here, before = Path.cwd(), set(sys.modules)
    with patched, mock.patch.object(sys, "path", [str(here), *sys.path]), warnings.catch_warnings():
        # A test module may have imported MODULE.__main__ already; running it again is fine.
        warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
        try:
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(script, run_name="__main__")
        except _Parsed:
            return True
        except SystemExit as e:
            if e.code not in (0, None):
                raise
        finally:  # modules imported from the scratch folder leave with it
            for name in set(sys.modules) - before:
                if str(getattr(sys.modules[name], "__file__", "")).startswith(str(here)):
                    del sys.modules[name]
    return False


def is_hub_id(data: str | None) -> bool:
    """``owner/name`` (``:config``): a Hub dataset, unless a local path of that name exists."""
    if not data or Path(data).exists():
        return False
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+(:[\w.-]+)?", data))


def ci_commands() -> list[list[str]]:
    """The commands ``.ci/run`` runs at its top level, as argument lists."""
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    return [shlex.split(line, comments=True) for line in lines if line[:1].isalpha()]


def check_pip(argv: list[str], where: str) -> None:
    if argv in ci_commands():
        return
    extras = re.fullmatch(r"-e \.\[([\w,]+)\]", " ".join(argv[2:]))
    assert argv[1] == "install" and extras, f"{where}: not what .ci/run installs, nor an extra"
    declared = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    for extra in extras[1].split(","):
        assert re.search(rf"^{extra} = \[", declared, re.M), f"{where}: no extra '{extra}'"


def check_pytest(argv: list[str], where: str) -> None:
    if argv in ci_commands():
        return
    files = [a.split("::")[0] for a in argv[3:] if not a.startswith("-")]
    assert files and all((REPO / f).is_file() for f in files), f"{where}: no such test file"


def chromium_available() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return Path("/usr/bin/chromium").is_file()


# Checks of what a page's blocks left behind, beyond their output.
def _python_api_wrote_its_files(run: PageRun) -> None:
    namespace = run.namespaces[-1]  # the complete example
    for name in ("attention.png", "attention_heads.png", "attention_words.png"):
        image = matplotlib.image.imread(run.folder / name)
        assert image.ndim == 3 and min(image.shape[:2]) > 50
    assert len(namespace["beam_results"]) == len(namespace["sentences"])
    assert all(1 <= len(hyps) <= 3 for hyps in namespace["beam_results"])
    lines = (run.folder / "hyps.txt").read_text(encoding="utf-8").splitlines()
    assert lines == namespace["greedy_texts"]


def _explorer_made_its_pictures(run: PageRun) -> None:
    from browser import not_blank

    for png in re.findall(r"\]\((\w+\.png)\)", (REPO / "docs" / "explorer.md").read_text("utf-8")):
        made = run.folder / "docs" / png
        assert made.is_file() and not_blank(made), f"docs/explorer.md: {png} was not made"


def _training_shows_the_defaults(run: PageRun) -> None:
    """docs/training.md's config block says it holds the defaults: it must."""
    (given,) = run.configs
    defaults, shown = Config(), config_from_dict(given)  # YAML lists read as the tuples they set
    for section, values in given.items():
        for key in values:
            value, default = (
                getattr(getattr(shown, section), key),
                getattr(getattr(defaults, section), key),
            )
            assert value == default, f"docs/training.md: {section}.{key} {value} != {default}"


AFTER = {
    "docs/python_api.md": _python_api_wrote_its_files,
    "docs/training.md": _training_shows_the_defaults,
}
if chromium_available():
    AFTER["docs/explorer.md"] = _explorer_made_its_pictures


@pytest.mark.parametrize("page", PAGES)
def test_every_block_runs_and_prints_what_the_page_shows(page, tour, tmp_path):
    run = PageRun(tour, checkout_like(tmp_path, tour.run))
    printed = None
    with working_directory(run.folder):
        for block in blocks(page):
            if block.lang != "text":
                printed = run.block(block)
                continue
            assert block.after_block and printed is not None, (
                f"{block.where}: a ```text block shows the output of the bash or python block "
                "right before it"
            )
            assert block.body.replace(ELLIPSIS, "").strip(), f"{block.where}: shows nothing"
            shown = block.body.rstrip("\n")
            diff = "\n".join(
                difflib.unified_diff(
                    shown.splitlines(), printed.splitlines(), "page", "printed", lineterm=""
                )
            )
            assert output_matches(shown, printed), f"{block.where}: the output differs:\n{diff}"
            printed = None
    if page in AFTER:
        AFTER[page](run)


def test_the_matcher_takes_what_the_page_shows_and_nothing_else():
    shown = "BLEU = 9.77 …\n…\nstop reasons: eos 100.0%"
    assert output_matches(
        shown, "BLEU = 9.81 34.0/7.3\nsignature x\nmore\nstop reasons: eos 100.0%"
    )
    assert output_matches(shown, "BLEU = 9.77 x\nstop reasons: eos 100.0%")
    assert not output_matches(shown, "BLEU = 11.20 x\nstop reasons: eos 100.0%")  # another number
    assert not output_matches(shown, "BLEU = 9.77 x\nstop reasons: eos 99.0%")  # 1%: too far
    assert output_matches("p = 0.8976", "p = 0.8977")
    assert output_matches("bits 3.07", "bits 3.05") and not output_matches("bits 3.07", "bits 3.04")
    assert not output_matches("p = 0.8976", "p = 0.8")
    assert not output_matches(shown, "BLEU = 9.77 x\nstop reasons: max_len 100.0%")
    assert not output_matches("[12, 14] [12, 14]", "[12, 15] [12, 15]")  # whole numbers exactly
    assert output_matches("version:2.6.0", "version:2.6.0")
    assert not output_matches("version:2.6.0", "version:2.6.1")
    assert terminal("bar 10%\rbar 50%\r      \rstep 400\n\rbar\r   \r") == "step 400"


def test_readme_is_a_front_door():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    first = next(b for b in blocks("README.md") if b.lang == "bash")
    ci = ci_commands()
    install = [shlex.split(line, comments=True) for line in commands(first.body)]
    assert install == [argv for argv in ci if argv[0] == "pip"], "install: .ci/run's, first"
    tests = [commands(b.body) for b in blocks("README.md") if "pytest" in b.body]
    assert tests == [["python -m pytest -q"]] and ["python", "-m", "pytest", "-q"] in ci
    start, end = text.index("<!-- records:results -->"), text.index("<!-- /records:results -->")
    assert start < end
    for page in PAGES[1:-1]:
        assert f"]({page})" in text, f"README.md does not link {page}"
    assert "](docs/results.md)" in text


_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_lead_to_files(page):
    text = (REPO / page).read_text(encoding="utf-8")
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (REPO / page).parent / target.split("#")[0]
        assert path.exists(), f"{page}: the link {target} leads nowhere"


@pytest.mark.parametrize("page", PAGES)
def test_no_figure_is_tied_to_a_machine_or_an_occasion(page):
    text = (REPO / page).read_text(encoding="utf-8")
    assert not re.search(r"\bVMs?\b|this session|earlier session|this machine's", text), page
