"""``seq2seq serve`` as a user meets it: started on a free port of 127.0.0.1, driven through
its page in headless Chromium (the influence map, the interventions panel), and sent bad
requests that must not stop it; then, in this process with short timeouts and deadlines, the
requests a hostile page or client could send, the work caps and concurrent maximal requests."""

import contextlib
import http.client
import json
import re
import selectors
import socket
import subprocess
import sys
import threading
import time

import pytest
from browser import chromium, explorer_run_dir, open_page
from helpers import child_env

from seq2seq.commands.cli import main
from seq2seq.decoding.translate import Translator
from seq2seq.errors import Seq2SeqError
from seq2seq.explorer import live
from seq2seq.explorer.live import MAX_BEAM, MAX_CHARS
from seq2seq.explorer.serve import (
    INTERNAL_ERROR,
    MAX_BODY_BYTES,
    ExplorerServer,
    make_server,
    serve,
)
from seq2seq.inspect.records import sentence_interventions
from seq2seq.model.attention import MultiHeadAttention

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
            [*command, "--device", "cpu"],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
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


def submit(
    page, text: str, max_len: str = "", ban_eos: bool = False, influence: bool = False
) -> None:
    page.fill("#text", text)
    page.fill("#max-len", max_len)
    page.set_checked("#ban-eos", ban_eos)
    page.set_checked("#influence", influence)
    with page.expect_navigation():
        page.click("#submit")
    assert page.get_attribute("body", "data-status") == "ok"


def answered(page) -> str:
    """How the interventions panel's request ended: "ok" or "error"."""
    page.wait_for_selector("body[data-intervention=ok], body[data-intervention=error]")
    return page.get_attribute("body", "data-intervention")


def test_page_translates_as_the_translate_command_does(server, browser, run_dir, capsys):
    url, _, _ = server
    page = open_page(browser, url)
    assert page.is_visible("#explore-form") and not page.is_visible("#explorer")
    assert page.get_attribute("#beam", "max") == str(MAX_BEAM)  # the form asks what is allowed
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


def test_beam_and_length_penalty_decode_again_and_the_tree_follows(
    server, browser, run_dir, capsys
):
    url, _, _ = server
    page = open_page(browser, url)
    page.fill("#beam", "3")
    page.fill("#length-penalty", "0")  # not the run's 1.0
    submit(page, SENTENCE)
    (record,) = page_records(page)
    command = ["translate", str(run_dir), SENTENCE, "--beam", "3", "--length-penalty", "0"]
    assert main([*command, "--device", "cpu"]) == 0
    assert page.inner_text("#translation") == capsys.readouterr().out.rstrip("\n")
    assert record["tree"]["alpha"] == 0.0 and record["tree"]["beam"] == 3
    assert page.input_value("#length-penalty") == "0"  # the form keeps what was asked
    page.click("button[data-view=tree]")
    shown = page.eval_on_selector_all("#tree g.node", "gs => gs.length")
    assert shown == len(record["tree"]["nodes"])
    assert float(page.input_value("#alpha-slider")) == 0.0
    assert "form above" in page.inner_text("#alpha-note")


def test_influence_is_computed_when_ticked_and_the_heatmap_toggles_to_it(server, browser):
    url, _, _ = server
    page = open_page(browser, url)
    assert page.is_checked("#influence")  # ticked on the first visit
    submit(page, SENTENCE)
    page.click(".tabs button[data-view=heatmap]")
    assert page.is_disabled(".toggle button[data-map=influence]")  # not asked for: none
    assert page_records(page)[0]["influence"] is None

    submit(page, SENTENCE, influence=True)
    record = page_records(page)[0]
    page.click(".tabs button[data-view=heatmap]")
    page.click(".toggle button[data-map=influence]")
    assert page.get_attribute("body", "data-map") == "influence"
    assert page.inner_text("#map-title").startswith("influence by occlusion")
    cells = page.eval_on_selector_all("#heatmap td.w", "tds => tds.map(td => +td.dataset.w)")
    assert cells == [w for row in record["influence"]["w"] for w in row]


def test_interventions_panel_decodes_again_a_kind_a_layer_or_a_clicked_word(
    server, browser, run_dir
):
    url, _, _ = server
    page = open_page(browser, url)
    submit(page, SENTENCE)
    page.click(".tabs button[data-view=interventions]")
    assert page.is_visible("#intervene") and not page.is_visible("#intervention-result")
    record = page_records(page)[0]

    page.click("#mask-words button >> nth=1")  # the second source subword, hidden
    assert answered(page) == "ok" and page.get_attribute("body", "data-spec") == "mask:2"
    expected = sentence_interventions(
        Translator.from_run(run_dir, "cpu"), SENTENCE, ["mask:2", "permuted:2"]
    )
    assert page.inner_text("#result-words") == " ".join(expected[0]["words"])
    assert record["src"][1] in page.inner_text("#result-spec")  # the word hidden, named
    marked = page.eval_on_selector_all("#result-words mark", "ms => ms.map(m => m.textContent)")
    changed = zip(expected[0]["words"], expected[0]["changed"], strict=True)
    assert marked == [w for w, c in changed if c]

    page.select_option("#kind-select", "permuted")
    page.select_option("#where-select", "2")
    page.click("#intervene")
    assert answered(page) == "ok" and page.get_attribute("body", "data-spec") == "permuted:2"
    assert page.inner_text("#result-words") == " ".join(expected[1]["words"])
    rows = page.eval_on_selector_all(
        "#interventions tr[data-spec]", "trs => trs.map(tr => tr.dataset.spec)"
    )
    assert rows == ["mask:2", "permuted:2"]  # both kept, each a click away


def test_empty_input_is_a_message_on_the_page(server, browser):
    url, _, _ = server
    page = open_page(browser, url)
    submit(page, "   ")
    assert "empty" in page.inner_text("#error") and not page.is_visible("#explorer")


def test_a_form_on_another_site_cannot_make_it_decode(server, browser):
    """What any web page the user visits could do: post a form to the local server."""
    url, _, _ = server
    attack = f'<form method="post" action="{url}"><input name="text" value="Ein Hund"></form>'
    page = browser.new_page()
    page.route(
        "http://attacker.example/",
        lambda route: route.fulfill(body=attack, content_type="text/html"),
    )
    page.goto("http://attacker.example/")
    with page.expect_navigation() as navigation:
        page.evaluate("document.forms[0].submit()")
    assert page.url == url and navigation.value.status == 403
    assert "from another site is refused" in page.inner_text("#error")


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
        (b"text=x&beam=0", 400, "beam must be a whole number from 1 to"),
        (b"text=x&beam=3&length_penalty=nan", 400, "length_penalty must be a number from -10"),
        (b"text=x&beam=3&length_penalty=11", 400, "length_penalty must be a number from -10"),
        ("text=x&beam=²".encode(), 400, "beam must be a whole number"),  # "²".isdigit()
        (b"text=x&max_len=%C2%B2", 400, "max_len must be a whole number"),
        ("text=" + "x\n" * 11, 400, "at most 10 at a time"),
        (b"text=%E2%80%8B&influence=1", 400, "the sentence has no subwords"),  # U+200B
        (b"text=Ein+Hund%0A%EF%BB%BF&influence=1", 400, "sentence 2 has no subwords"),  # U+FEFF
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


@pytest.fixture(scope="module")
def translator(run_dir):
    return Translator.from_run(run_dir, "cpu")


@contextlib.contextmanager
def serving(server: ExplorerServer):
    """``server`` serving from a thread: yields its port."""
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def running(translator, host="127.0.0.1", **options):
    """A server on a free port, serving from a thread: yields its port."""
    with serving(make_server(translator, host, 0, **options)) as port:
        yield port


def send(port, method="POST", path="/", headers=None, body=b"text=Ein+Hund"):
    """Status and page of one request, with exactly the headers given (Host by default)."""
    headers = {"Host": f"127.0.0.1:{port}", **(headers or {})}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            if value is not None:
                conn.putheader(name, value)
        if method == "POST":
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body if method == "POST" else None)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8")
    finally:
        conn.close()


def slow_client(port: int) -> socket.socket:
    """A connection that promises a 64 KiB body and sends none of it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 65536\r\n\r\n".encode()
    )
    return sock


def closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes ``sock`` (the test fails if it does not in 10 s)."""
    began = time.monotonic()
    while sock.recv(4096):  # a response, if any, then the end
        pass
    sock.close()
    return time.monotonic() - began


# The request timeout of the tests that time a server from a thread: long enough that a
# request answered beside other work (the suite's other workers, their torchrun jobs) still
# comes well within it, so that "within the timeout" tells a request served apart from one
# that waited for the timeout to free the server.
TIMEOUT_S = 2.0


def test_slow_clients_are_dropped_and_never_crowd_out_a_request(translator):
    """experiments/robustness/serve_load.py, fast: 50 clients that send headers and no body."""
    with running(translator, timeout=TIMEOUT_S) as port:
        clients = [slow_client(port) for _ in range(50)]
        for _ in range(5):
            began = time.monotonic()
            assert send(port)[0] == 200  # served beside them
            assert time.monotonic() - began < TIMEOUT_S
        assert all(closed_after(c) < 1.5 * TIMEOUT_S for c in clients)
        began = time.monotonic()
        assert send(port)[0] == 200 and time.monotonic() - began < TIMEOUT_S


def test_a_client_sending_a_byte_at_a_time_is_cut_at_the_deadline(translator):
    with running(translator, timeout=TIMEOUT_S) as port:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        began = time.monotonic()
        with pytest.raises(OSError):  # the server closed the connection
            for byte in f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: {'x' * 50}":
                sock.sendall(byte.encode())
                time.sleep(0.1)
        # each byte came well within the socket timeout; all of them take about 10 s
        assert time.monotonic() - began < 2.5 * TIMEOUT_S
        sock.close()


def test_connections_over_the_cap_are_told_to_come_back(translator):
    with running(translator, timeout=1.0, max_connections=2) as port:
        clients = [slow_client(port) for _ in range(2)]
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        extra.sendall(f"GET / HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        assert extra.recv(4096).startswith(b"HTTP/1.0 503 ")
        extra.close()
        for c in clients:
            closed_after(c)
        assert send(port, "GET", body=None)[0] == 200  # the slots came back


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:{port}", 200),
        ("localhost:{port}", 200),
        ("LOCALHOST", 200),
        ("attacker.example:{port}", 403),  # DNS rebinding: a name that resolved to us
        ("attacker.example@127.0.0.1:{port}", 403),
        ("10.0.0.1:{port}", 403),  # not the bound address
        (None, 403),
    ],
)
def test_host_must_name_this_server(translator, host, status):
    with running(translator) as port:
        host = host and host.format(port=port)
        for method in ("GET", "POST"):
            got, page = send(port, method, headers={"Host": host})
            assert got == status
            if status == 403:
                assert "this server answers only to 127.0.0.1 or localhost" in error_shown(page)


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("POST", "/", {"Origin": "http://attacker.example"}, 403),
        ("POST", "/", {"Origin": "null"}, 403),
        ("POST", "/", {"Origin": "http://localhost:{port}"}, 403),  # not the Host it sent
        ("POST", "/", {"Origin": "http://127.0.0.1:{port}"}, 200),
        ("POST", "/", {"Sec-Fetch-Site": "cross-site"}, 403),
        ("POST", "/", {"Sec-Fetch-Site": "same-site"}, 403),  # another port of localhost
        ("POST", "/", {"Sec-Fetch-Site": "same-origin"}, 200),
        ("GET", "/?text=Ein+Hund&beam=8", {"Sec-Fetch-Site": "cross-site"}, 403),
        ("GET", "/?text=Ein+Hund&beam=8", {"Sec-Fetch-Site": "none"}, 200),  # typed in
        ("GET", "/", {"Sec-Fetch-Site": "cross-site"}, 200),  # a link to the empty form
    ],
)
def test_requests_that_decode_must_come_from_this_page(translator, method, path, headers, status):
    with running(translator) as port:
        headers = {k: v.format(port=port) for k, v in headers.items()}
        got, page = send(port, method, path, headers)
        assert got == status
        if status == 403:
            assert "from another site is refused" in error_shown(page)
        else:
            assert "explorer-data" in page


@pytest.mark.parametrize(("length", "status"), [("²", 400), ("1e3", 400), ("", 411)])
def test_a_bad_content_length_is_a_message(translator, length, status):
    with running(translator) as port:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        head = f"POST / HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {length}\r\n\r\n"
        sock.sendall(head.encode("latin-1") + b"text=x")  # as http.server reads headers
        response = b"".join(iter(lambda: sock.recv(65536), b"")).decode()
        sock.close()
        assert response.startswith(f"HTTP/1.0 {status} ")
        assert ("Content-Length must be" if length else "has no length") in error_shown(response)
        assert send(port)[0] == 200


def test_an_internal_error_is_a_generic_page_and_logged(translator, monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise RuntimeError("secret <detail> at /home/user")

    monkeypatch.setattr(live, "sentence_records", fail)
    with running(translator) as port:
        status, page = send(port)
    assert status == 500 and error_shown(page) == INTERNAL_ERROR.replace("'", "&#x27;")
    assert "secret" not in page and "RuntimeError" not in page
    assert "RuntimeError: secret <detail>" in capsys.readouterr().err


def test_the_work_of_one_request_is_capped_counting_the_beam_and_influence(translator, monkeypatch):
    """With EOS banned every output runs to max_len, so the page's map of a hypothesis holds
    exactly the weights the cap counts for it: the cap takes beam hypotheses of that size (and
    under beam search as many again, for the tree's rows), plus one occlusion pass per source
    subword with influence, plus the chosen output's self-attention (encoder and decoder), and
    refuses one weight more."""
    decoded = []

    def recording(*args, **kwargs):
        records = sentence_records(*args, **kwargs)
        decoded.append(records)
        return records

    sentence_records = live.sentence_records
    monkeypatch.setattr(live, "sentence_records", recording)
    form = "text=Ein+Hund%0AZwei+Hunde+laufen&ban_eos=on&max_len="
    with running(translator) as port:
        assert send(port, body=f"{form}20&beam=1".encode())[0] == 200
        (records,) = decoded
        hypothesis = sum(r["weights"].size for r in records)  # (L, H, 20, S) each
        occluded = sum(r["weights"].size * len(r["src_tokens"]) for r in records)
        own = sum(r["encoder_weights"].size + r["decoder_weights"].size for r in records)
        assert all(r["decoder_weights"].shape[2:] == (20, 20) for r in records)

        def refused(body: str, cap: int) -> bool:
            monkeypatch.setattr(live, "MAX_WEIGHTS", cap)
            status, page = send(port, body=body.encode())
            assert status in (200, 400), status
            assert status == 200 or f"at most {cap:,} at a time" in error_shown(page)
            return status == 400

        assert not refused(f"{form}20&beam=2", 4 * hypothesis + own)
        assert refused(f"{form}20&beam=2", 4 * hypothesis + own - 1)
        assert refused(f"{form}20&beam=2", hypothesis + own)  # a cap blind to the beam let it pass
        assert refused(f"{form}20&beam=2", 4 * hypothesis)  # or blind to the self-attention
        assert refused(f"{form}21&beam=2", 4 * hypothesis + own)
        assert not refused(f"{form}20&beam=1&influence=on", hypothesis + occluded + own)
        assert refused(f"{form}20&beam=1&influence=on", hypothesis + occluded + own - 1)
    assert len(decoded) == 3  # the refused requests decoded nothing


def test_beam_and_max_len_have_limits_of_their_own(translator, monkeypatch):
    monkeypatch.setattr(live, "MAX_LEN", 20)  # below this model's own limit, 63
    with running(translator) as port:
        assert send(port, body=b"text=Ein+Hund&ban_eos=on&max_len=20")[0] == 200
        status, page = send(port, body=b"text=Ein+Hund&max_len=21")
        assert status == 400 and "max_len must be a whole number from 1 to 20" in page
        status, page = send(port, body=f"text=Ein+Hund&beam={MAX_BEAM + 1}".encode())
        assert status == 400 and f"beam must be a whole number from 1 to {MAX_BEAM}" in page


def test_a_non_loopback_address_needs_public(run_dir, translator, capsys, monkeypatch):
    with pytest.raises(Seq2SeqError, match="not a loopback address.*--public"):
        make_server(translator, "0.0.0.0", 0)
    assert main(["serve", str(run_dir), "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a loopback address" in err and "--public" in err

    with running(translator, "0.0.0.0", public=True) as port:  # any IP: unknown which is used
        assert send(port, headers={"Host": f"192.0.2.7:{port}"})[0] == 200
        assert send(port, headers={"Host": f"attacker.example:{port}"})[0] == 403

    def interrupted(self, *args):
        raise KeyboardInterrupt

    monkeypatch.setattr(ExplorerServer, "serve_forever", interrupted)
    serve(run_dir, "0.0.0.0", 0, "cpu", public=True)
    assert "warning: 0.0.0.0 is reachable from the network" in capsys.readouterr().err


def intervene(port: int, body: str, headers=None) -> tuple[int, dict]:
    """Status and JSON answer of one request to the interventions panel's address."""
    status, text = send(port, path="/intervene", body=body.encode(), headers=headers)
    return status, json.loads(text)


def test_an_intervention_beyond_the_caps_or_malformed_is_refused_and_it_keeps_serving(
    translator, monkeypatch
):
    n_layers = translator.model.config.n_dec_layers
    with running(translator) as port:
        status, answer = intervene(port, "text=Ein+Hund&spec=uniform:1")
        assert status == 200 and answer["intervention"]["spec"] == "uniform:1"
        for body, message in [
            ("text=Ein+Hund&spec=uniform:9", f"the decoder has layers 1..{n_layers}"),
            ("text=Ein+Hund&spec=mask:99", "the source has"),
            ("text=Ein+Hund&spec=flat", "unknown kind 'flat'"),
            ("text=Ein+Hund&spec=mask:%C2%B2", "name the source position"),  # "²" isdigit()
            ("text=Ein+Hund&spec=uniform:%C2%B2", f"the decoder has layers 1..{n_layers}"),
            ("text=Ein+Hund&spec=", "name one intervention"),
            ("text=Ein+Hund&spec=" + "x" * 500, "name one intervention"),
            ("text=Ein+Hund%0AZwei+Hunde&spec=kept", "one sentence, got 2"),
            ("text=%E2%80%8B&spec=mask:1", "the sentence has no subwords"),  # U+200B
            ("text=&spec=kept", "the text is empty"),
            ("text=" + "a" * (MAX_CHARS + 1) + "&spec=kept", f"at most {MAX_CHARS}"),
            ("text=Ein+Hund&spec=kept&max_len=999", "max_len must be a whole number"),
        ]:
            status, answer = intervene(port, body)
            assert status == 400 and message in answer["error"], (body[:40], answer)
        monkeypatch.setattr(live, "MAX_WEIGHTS", 100)  # two greedy decodings: more
        status, answer = intervene(port, "text=Ein+Hund&spec=uniform:1")
        assert status == 400 and "at most 100 at a time" in answer["error"]
        monkeypatch.undo()
        assert intervene(port, "text=Ein+Hund&spec=permuted:all")[0] == 200  # still serving
        assert send(port, "GET", "/intervene", body=None)[0] == 404  # decodes by POST only
        cross_site = {"Sec-Fetch-Site": "cross-site"}
        assert send(port, path="/intervene", body=b"text=x&spec=kept", headers=cross_site)[0] == 403


def test_the_panel_shows_a_refusal_and_the_next_request_is_answered(
    translator, browser, monkeypatch
):
    with running(translator) as port:
        page = open_page(browser, f"http://127.0.0.1:{port}/")
        submit(page, SENTENCE)
        page.click(".tabs button[data-view=interventions]")
        monkeypatch.setattr(live, "MAX_WEIGHTS", 100)
        page.click("#mask-words button >> nth=0")
        assert answered(page) == "error"
        assert "at most 100 at a time" in page.inner_text("#intervention-status")
        assert "HTTP 400" in page.inner_text("#intervention-status")
        monkeypatch.undo()
        page.click("#mask-words button >> nth=0")
        assert answered(page) == "ok" and page.is_visible("#intervention-result")


@contextlib.contextmanager
def slow_decoding(translator, seconds_per_step: float):
    """Every decoder pass of the model takes at least ``seconds_per_step`` longer."""
    model = translator.model
    decode = model.decode

    def slow(*args, **kwargs):
        time.sleep(seconds_per_step)
        return decode(*args, **kwargs)

    model.decode = slow
    try:
        yield
    finally:
        del model.decode  # the class's method again


def test_a_request_past_the_deadline_gets_503_and_frees_the_model(translator):
    """60 steps of at least 0.1 s would decode for 6 s; the deadline is 0.5 s. Each request
    ends soon after it, the model's lock is free again, and the next request is answered."""
    server = make_server(translator, "127.0.0.1", 0, deadline=0.5)
    lock = server.RequestHandlerClass.explorer.lock
    with serving(server) as port:
        long_form = b"text=Ein+Hund&ban_eos=on&beam=2&max_len=60"
        with slow_decoding(translator, 0.1):
            for path, body in [("/", long_form), ("/intervene", long_form + b"&spec=mask:1")]:
                began = time.monotonic()
                status, text = send(port, path=path, body=body)
                assert status == 503 and time.monotonic() - began < 3, path
                assert "busy: no answer within 0.5 seconds" in text
                assert lock.acquire(blocking=False), "the model's lock was kept"
                lock.release()
        layers = translator.model.decoder_layers
        assert all(type(layer.cross_attn) is MultiHeadAttention for layer in layers)

        with lock:  # another request holds the model past the deadline
            began = time.monotonic()
            status, page = send(port)
            waited = time.monotonic() - began
        assert status == 503 and 0.5 <= waited < 3
        assert "busy: no answer within 0.5 seconds" in error_shown(page)
        assert send(port)[0] == 200  # served again


def test_concurrent_maximal_requests_end_within_the_deadline_and_it_keeps_serving(
    translator, monkeypatch
):
    """experiments/robustness/serve_load.py, small: six clients at once, each asking for
    all the work a (lowered) cap allows, by beam or by influence, every output as long as
    max_len; a 1 s deadline. Each gets the page or 503, a 503 soon after the deadline, and
    a normal request is answered after them."""
    cap, max_len = 1 << 18, 40
    monkeypatch.setattr(live, "MAX_WEIGHTS", cap)
    server = make_server(translator, "127.0.0.1", 0, deadline=1.0)
    work = server.RequestHandlerClass.explorer.work
    bodies = []
    for sentence, beam, influence in [("Ein Hund läuft über die Wiese.", MAX_BEAM, False),
                                      ("Ein Hund", 1, True)]:  # fmt: skip
        n = max(k for k in range(1, 11) if work([sentence] * k, max_len, beam, influence) <= cap)
        assert work([sentence] * n, max_len, beam, influence) > cap // 2  # near the cap
        text = "%0A".join([sentence] * n)
        influence_field = "&influence=on" if influence else ""
        bodies.append(f"text={text}&beam={beam}&max_len={max_len}&ban_eos=on{influence_field}")
    answers: list[tuple[int, float]] = []

    def client(body: str) -> None:
        began = time.monotonic()
        status, _ = send(port, body=body.encode())
        answers.append((status, time.monotonic() - began))

    with serving(server) as port:
        threads = [threading.Thread(target=client, args=(bodies[k % 2],)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(answers) == 6, "a client got no answer"
        assert {status for status, _ in answers} <= {200, 503}, answers
        assert max((s for status, s in answers if status == 503), default=0) < 1.0 + 3, answers
        began = time.monotonic()
        assert send(port)[0] == 200 and time.monotonic() - began < 3
