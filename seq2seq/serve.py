"""``seq2seq serve``: the attention explorer as a local web page, for sentences typed in.

The standard library's ``http.server``, bound to 127.0.0.1 unless told otherwise. The run
is loaded once at start; each request translates the sentences of a form (one per line)
with the same code as ``seq2seq attention`` and answers with the explorer page
(``explorer.render_page``) with the form above it: beam, max_len and "ban EOS" change the
decoding, so a user sees that only the length of the output changes.

Bad input (empty, too long, invalid UTF-8, a malformed number) gets the form back with a
message on the page and status 400; an unexpected failure gets a one-line message and
status 500. Neither stops the server.
"""

from __future__ import annotations

import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from seq2seq.attention_report import sentence_records
from seq2seq.errors import Seq2SeqError
from seq2seq.explorer import render_page
from seq2seq.translate import Translator

MAX_BODY_BYTES = 64 * 1024  # a request larger than this is refused unread
MAX_CHARS = 2000  # characters of text per request
MAX_SENTENCES = 10  # lines per request
MAX_BEAM = 16
TITLE = "Attention explorer"


def _number(form: dict, key: str, largest: int) -> int | None:
    text = form.get(key, "").strip()
    if not text:
        return None
    if not text.isdigit() or not 1 <= int(text) <= largest:
        raise Seq2SeqError(f"{key} must be a whole number from 1 to {largest}, got '{text[:20]}'")
    return int(text)


class Explorer:
    """A loaded run and the one lock its model is used under."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator
        self.lock = threading.Lock()

    def page(self, form: dict[str, str]) -> tuple[int, str]:
        """Status and page for the submitted ``form`` (field name -> value)."""
        shown = {
            "text": form.get("text", ""),
            "beam": form.get("beam", ""),
            "max_len": form.get("max_len", ""),
            "ban_eos": bool(form.get("ban_eos")),
            "words": bool(form.get("words")),
        }
        if "text" not in form:  # the first visit: an empty form
            return HTTPStatus.OK, render_page([], title=TITLE, form=shown)
        try:
            records = self._translate(form)
        except Seq2SeqError as e:
            return HTTPStatus.BAD_REQUEST, render_page([], title=TITLE, form=shown, error=str(e))
        return HTTPStatus.OK, render_page(records, title=TITLE, form=shown)

    def _translate(self, form: dict[str, str]) -> list[dict]:
        text = form["text"]
        if len(text) > MAX_CHARS:
            raise Seq2SeqError(f"the text has {len(text)} characters; at most {MAX_CHARS} please")
        sentences = [line for line in text.splitlines() if line.strip()]
        if not sentences:
            raise Seq2SeqError("the text is empty: type a sentence to translate")
        if len(sentences) > MAX_SENTENCES:
            raise Seq2SeqError(f"{len(sentences)} sentences; at most {MAX_SENTENCES} at a time")
        max_len = _number(form, "max_len", self.translator.model.config.max_positions - 1)
        beam = _number(form, "beam", MAX_BEAM)
        with self.lock:
            return sentence_records(
                self.translator, sentences, beam=beam, max_len=max_len,
                ban_eos=bool(form.get("ban_eos")), words=bool(form.get("words")),
            )  # fmt: skip


def _form(data: bytes) -> dict[str, str]:
    """``a=1&b=2`` (UTF-8, percent-encoded or not) as a dict; invalid UTF-8 is a Seq2SeqError."""
    # Latin-1 maps each byte to one character and back, so the UTF-8 check can come last.
    fields = parse_qs(data.decode("latin-1"), keep_blank_values=True, encoding="latin-1")
    try:
        return {
            key.encode("latin-1").decode("utf-8"): values[-1].encode("latin-1").decode("utf-8")
            for key, values in fields.items()
        }
    except UnicodeDecodeError:
        raise Seq2SeqError("the text is not valid UTF-8: nothing was translated") from None


class _Handler(BaseHTTPRequestHandler):
    explorer: Explorer  # set on the subclass make_server builds
    server_version = "seq2seq-explorer"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        url = urlsplit(self.path)
        if url.path != "/":
            self._send(
                HTTPStatus.NOT_FOUND, render_page([], title=TITLE, error="no such page: try /")
            )
            return
        self._answer(url.query.encode("latin-1", "replace") if url.query else None)

    def do_POST(self) -> None:  # noqa: N802
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            self._send(HTTPStatus.LENGTH_REQUIRED, self._error_page("the request has no length"))
            return
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True  # the body is left unread
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, self._error_page(
                f"the request has {int(length)} bytes; at most {MAX_BODY_BYTES} please"))  # fmt: skip
            return
        self._answer(self.rfile.read(int(length)))

    def _answer(self, body: bytes | None) -> None:
        try:
            form = _form(body) if body is not None else {}
            status, page = self.explorer.page(form)
        except Seq2SeqError as e:
            status, page = HTTPStatus.BAD_REQUEST, self._error_page(str(e))
        except Exception as e:  # noqa: BLE001 (one request's failure must not stop the server)
            self.log_error("failed: %s", repr(e))
            status, page = (
                HTTPStatus.INTERNAL_SERVER_ERROR,
                self._error_page(f"internal error: {e}"),
            )
        self._send(status, page)

    def _error_page(self, message: str) -> str:
        return render_page([], title=TITLE, form={"text": ""}, error=message)

    def _send(self, status: int, page: str) -> None:
        data = page.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)


def make_server(
    translator: Translator, host: str = "127.0.0.1", port: int = 8000
) -> ThreadingHTTPServer:
    """A server for the explorer (not started); port 0 picks a free one."""
    handler = type("Handler", (_Handler,), {"explorer": Explorer(translator)})
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as e:
        raise Seq2SeqError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    server.daemon_threads = True
    return server


def serve(
    run_dir: str | Path, host: str = "127.0.0.1", port: int = 8000, device: str = "auto"
) -> None:
    """Load the run, then serve the explorer until interrupted (Ctrl-C)."""
    translator = Translator.from_run(run_dir, device)
    server = make_server(translator, host, port)
    address, bound = server.server_address[:2]
    print(f"serving {run_dir} at http://{address}:{bound}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.server_close()
