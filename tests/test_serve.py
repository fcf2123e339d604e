"""``seq2seq serve`` as a user meets it: started on a free port of 127.0.0.1, driven through
its page in headless Chromium, and sent bad requests that must not stop it."""

import http.client
import json
import re
import selectors
import subprocess
import sys

import pytest
from browser import chromium, explorer_run_dir, open_page

from seq2seq.cli import main
from seq2seq.errors import Seq2SeqError
from seq2seq.serve import MAX_BODY_BYTES, MAX_CHARS, make_server

SENTENCE = "Ein Hund läuft über die Wiese."


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return explorer_run_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    """The server's URL, from the line it prints once it listens; stopped after the tests."""
    command = [sys.executable, "-m", "seq2seq", "serve", str(run_dir), "--port", "0"]
    log = tmp_path_factory.mktemp("serve") / "requests.log"  # a file: a pipe could fill up
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [*command, "--device", "cpu"], stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            ready = sel.select(timeout=120)
        line = proc.stdout.readline() if ready else ""
        found = re.search(r"http://(127\.0\.0\.1):(\d+)/", line)
        assert found, f"no URL printed: {line!r}; stderr: {log.read_text()}"
        yield found.group(0), int(found.group(2)), proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def page_records(page) -> list[dict]:
    return page.evaluate("JSON.parse(document.getElementById('explorer-data').textContent).records")


def submit(page, text: str, max_len: str = "", ban_eos: bool = False) -> None:
    page.fill("#text", text)
    page.fill("#max-len", max_len)
    page.set_checked("#ban-eos", ban_eos)
    with page.expect_navigation():
        page.click("#submit")
    assert page.get_attribute("body", "data-status") == "ok"


def test_page_translates_as_the_translate_command_does(server, browser, run_dir, capsys):
    url, _, _ = server
    page = open_page(browser, url)
    assert page.is_visible("#explore-form") and not page.is_visible("#explorer")
    submit(page, SENTENCE)
    assert main(["translate", str(run_dir), SENTENCE, "--device", "cpu"]) == 0
    expected = capsys.readouterr().out.rstrip("\n")
    assert expected and page.inner_text("#translation") == expected
    assert page.input_value("#text") == SENTENCE  # the form keeps what was asked
    page.keyboard.press("ArrowRight")
    assert page.get_attribute("body", "data-step") == "2"  # the same explorer as the report


def test_ban_eos_changes_only_the_length(server, browser):
    url, _, _ = server
    page = open_page(browser, url)
    submit(page, SENTENCE, max_len="60")
    free = page_records(page)[0]
    assert free["stop_reason"] == "eos"  # this model stops by itself well before max_len

    submit(page, SENTENCE, max_len="60", ban_eos=True)
    banned = page_records(page)[0]
    assert banned["stop_reason"] == "max_len" and banned["max_len"] == 60
    assert int(page.get_attribute("#step-slider", "max")) == len(banned["steps"]) == 60
    assert "max_len = 60" in page.inner_text("#stop-info")
    assert page.is_checked("#ban-eos")
    # Greedy search with EOS banned takes the same steps until EOS would have come.
    chosen = [s["token"] for s in banned["steps"]]
    assert chosen[: free["stop_step"] - 1] == [s["token"] for s in free["steps"]][:-1]


def test_empty_input_is_a_message_on_the_page(server, browser):
    url, _, _ = server
    page = open_page(browser, url)
    submit(page, "   ")
    assert "empty" in page.inner_text("#error") and not page.is_visible("#explorer")


def post(port: int, body: bytes, content_type="application/x-www-form-urlencoded"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/", body=body, headers={"Content-Type": content_type})
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8")
    finally:
        conn.close()


def error_shown(page: str) -> str:
    return re.search(r'<p id="error" role="alert">([^<]*)</p>', page).group(1)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"text=%FF%FEbad", 400, "not valid UTF-8"),
        (b"text=\xc3\x28", 400, "not valid UTF-8"),
        (b"text=", 400, "the text is empty"),
        (b"text=" + b"a" * (MAX_CHARS + 1), 400, f"at most {MAX_CHARS}"),
        (b"text=" + b"a" * MAX_BODY_BYTES, 413, f"at most {MAX_BODY_BYTES}"),
        (b"text=x&max_len=-3", 400, "max_len must be a whole number"),
        (b"text=x&beam=999", 400, "beam must be a whole number"),
        ("text=" + "x\n" * 11, 400, "at most 10 at a time"),
    ],
)
def test_bad_requests_get_a_message_and_the_server_lives_on(server, body, status, message):
    _, port, proc = server
    if isinstance(body, str):
        body = body.encode()
    got, page = post(port, body)
    assert got == status and message in error_shown(page)
    assert proc.poll() is None
    assert post(port, b"text=Ein+Hund")[0] == 200  # still serving


def test_other_paths_are_not_found_and_it_binds_to_localhost(server):
    url, port, _ = server
    assert url.startswith("http://127.0.0.1:")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/../etc/passwd")
    response = conn.getresponse()
    assert response.status == 404 and "no such page" in response.read().decode()
    conn.close()


def test_a_port_in_use_is_a_one_line_error(server):
    _, port, _ = server
    with pytest.raises(Seq2SeqError, match=f"cannot listen on 127.0.0.1:{port}"):
        make_server(None, "127.0.0.1", port)


def test_a_missing_run_is_one_line(capsys, tmp_path):
    assert main(["serve", str(tmp_path / "nothing"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such run directory" in err


def test_the_form_data_is_json_safe(server):
    _, port, _ = server
    status, page = post(port, b"text=</script><b>x")
    assert status == 200 and page.count("</script>") == 2
    data = re.search(r'id="explorer-data">(.*?)</script>', page, re.S).group(1)
    assert json.loads(data)["form"]["text"] == "</script><b>x"
