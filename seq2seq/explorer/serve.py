"""``seq2seq serve``: the attention explorer as a local web page, for sentences typed in.

The standard library's ``http.server``, bound to 127.0.0.1 unless told otherwise. The run
is loaded once at start; each request's form goes to the explorer (``live.Explorer``),
which decodes its sentences with the same code as ``seq2seq attention`` and answers with the
explorer page, the form above it. The page's interventions panel posts one sentence and one
intervention to ``/intervene`` and gets JSON back.

Bad input (empty, too long, invalid UTF-8, a malformed number) gets the form back with a
message on the page and status 400; an unexpected failure gets a generic message and
status 500, its detail going to the server's log (stderr). Neither stops the server.

Any web page the user visits can send requests to a local server, so the server guards
what it spends: a request that asks to decode must come from its own page (Host names this
server, Origin and Sec-Fetch-Site, where a browser sends them, say the same site); a
request must arrive whole within ``REQUEST_TIMEOUT`` seconds; at most ``MAX_CONNECTIONS``
are handled at once (more get 503); what one request may ask for, and how long it may take,
the explorer bounds (``live.MAX_WEIGHTS``, ``DEADLINE``). Binding an address other
than loopback takes ``public=True``.
"""

from __future__ import annotations

import io
import ipaddress
import json
import re
import socket
import sys
import threading
import time
import traceback
from email.message import Message
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from seq2seq.config import DEFAULT_DEVICE
from seq2seq.decoding.translate import Translator
from seq2seq.errors import Seq2SeqError, whole_number
from seq2seq.explorer.live import DEADLINE, TITLE, Explorer
from seq2seq.explorer.page import render_page

MAX_BODY_BYTES = 64 * 1024  # a request larger than this is refused unread
REQUEST_TIMEOUT = 10.0  # seconds for a request's line, headers and body to arrive
MAX_CONNECTIONS = 64  # handled at once, one thread each
INTERVENE_PATH = "/intervene"  # the interventions panel posts here; JSON comes back
INTERNAL_ERROR = "internal error: nothing was translated (the server's log has the details)"
_HOST = re.compile(r"(\[[0-9a-fA-F:.]+\]|[^\[\]:/@\s]+)(:[0-9]{1,5})?")
_SAME_SITE = ("same-origin", "none")  # Sec-Fetch-Site of the page's own form, or a typed URL
_BUSY_TEXT = b"busy: too many connections at once; try again in a few seconds"
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
_BUSY += b"Content-Length: %d\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT)


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


class _Deadline(io.RawIOBase):
    """A socket's reads, which together must end by a deadline: a client that sends a byte
    now and then holds its connection no longer than one that sends nothing."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.sock = sock
        self.end = time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    explorer: Explorer  # set on the subclass make_server builds
    server_version = "seq2seq-explorer"

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(_Deadline(self.connection, self.timeout))

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        url = urlsplit(self.path)
        if self._refused(decodes=bool(url.query)):
            return
        if url.path != "/":
            self._send(HTTPStatus.NOT_FOUND, self._error_page("no such page: try /"))
            return
        self._answer(url.query.encode("latin-1", "replace") if url.query else None)

    def do_POST(self) -> None:  # noqa: N802
        if self._refused(decodes=True):
            return
        path = urlsplit(self.path).path
        if path not in ("/", INTERVENE_PATH):
            self.close_connection = True  # the body is left unread
            self._send(HTTPStatus.NOT_FOUND, self._error_page("no such page: try /"))
            return
        text = self.headers.get("Content-Length", "").strip()
        length = whole_number(text)
        if length is None:
            status = HTTPStatus.BAD_REQUEST if text else HTTPStatus.LENGTH_REQUIRED
            message = f"Content-Length must be a whole number, got '{text[:20]}'"
            self._send(status, self._error_page(message if text else "the request has no length"))
            return
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the body is left unread
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, self._error_page(
                f"the request has {length} bytes; at most {MAX_BODY_BYTES} please"))  # fmt: skip
            return
        body = self.rfile.read(length)
        if path == INTERVENE_PATH:
            self._answer_json(body)
        else:
            self._answer(body)

    def _refused(self, decodes: bool) -> bool:
        """Answer a request this server does not take (403), and say whether it did."""
        message = self.server.refusal(self.headers, decodes)
        if message:
            self.close_connection = True  # a POST's body is left unread
            self._send(HTTPStatus.FORBIDDEN, self._error_page(message))
        return bool(message)

    def _answer(self, body: bytes | None) -> None:
        try:
            form = _form(body) if body is not None else {}
            status, page = self.explorer.page(form)
        except Seq2SeqError as e:
            status, page = HTTPStatus.BAD_REQUEST, self._error_page(str(e))
        except Exception:  # noqa: BLE001 (one request's failure must not stop the server)
            self.log_error("internal error:\n%s", traceback.format_exc())
            status, page = HTTPStatus.INTERNAL_SERVER_ERROR, self._error_page(INTERNAL_ERROR)
        self._send(status, page)

    def _answer_json(self, body: bytes) -> None:
        try:
            status, answer = self.explorer.intervention(_form(body))
        except Seq2SeqError as e:
            status, answer = HTTPStatus.BAD_REQUEST, {"error": str(e)}
        except Exception:  # noqa: BLE001 (one request's failure must not stop the server)
            self.log_error("internal error:\n%s", traceback.format_exc())
            status, answer = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": INTERNAL_ERROR}
        self._send(status, json.dumps(answer, ensure_ascii=False), "application/json")

    def _error_page(self, message: str) -> str:
        return render_page([], title=TITLE, form={"text": "", "influence": True}, error=message)

    def _send(self, status: int, page: str, content_type: str = "text/html") -> None:
        data = page.encode("utf-8")
        self.connection.settimeout(self.timeout)  # for each write, whatever reading left
        self.send_response(status)
        self.send_header("Content-Type", f"{content_type}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)


class ExplorerServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with at most ``max_connections`` threads, each handling one
    request, and the Host/Origin rules of ``refusal``."""

    daemon_threads = True
    block_on_close = False  # Ctrl-C does not wait for clients that send nothing
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, address: tuple[str, int], handler: type, max_connections: int) -> None:
        self.slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)
        self.loopback = ipaddress.ip_address(self.server_address[0]).is_loopback
        self.wildcard = ipaddress.ip_address(self.server_address[0]).is_unspecified
        self.hosts = {"localhost", "127.0.0.1", "::1", address[0].lower(), self.server_address[0]}

    def process_request(self, request: socket.socket, client_address: tuple) -> None:
        if not self.slots.acquire(blocking=False):
            self._busy(request)
            return
        try:
            super().process_request(request, client_address)  # starts the thread
        except Exception:
            self.slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: tuple) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def _busy(self, request: socket.socket) -> None:
        """Answer 503 from the accepting thread, without waiting on the client."""
        try:
            request.settimeout(0.5)
            request.sendall(_BUSY)
        except OSError:
            pass  # a client that cannot take 200 bytes is not waited for
        self.shutdown_request(request)

    def refusal(self, headers: Message, decodes: bool) -> str:
        """Why a request with these headers is refused ("" if it is not). Host must name this
        server: a web page whose name was made to resolve to 127.0.0.1 (DNS rebinding) sends
        its own. A request that decodes must come from this server's own page: a browser says
        where a request comes from in Origin (POST) or Sec-Fetch-Site (any request)."""
        host = headers.get("Host", "")
        found = _HOST.fullmatch(host)
        name = found.group(1).strip("[]").lower() if found else ""
        if not name or not self._names_this_server(name):
            return f"this server answers only to {self._address()}, not to Host '{host[:60]}'"
        origin, site = headers.get("Origin"), headers.get("Sec-Fetch-Site", "none")
        if decodes and (origin not in (None, f"http://{host}") or site not in _SAME_SITE):
            return "a request from another site is refused: use the form on this page"
        return ""

    def _names_this_server(self, name: str) -> bool:
        """True for localhost or the bound address; bound to every interface, for any IP
        address (the one a client used is unknown, and rebinding needs a domain name)."""
        if name in self.hosts:
            return True
        try:
            return self.wildcard and bool(ipaddress.ip_address(name))
        except ValueError:
            return False

    def _address(self) -> str:
        host, port = self.server_address[:2]
        return f"{'its IP address' if self.wildcard else host} or localhost, port {port}"


def make_server(
    translator: Translator,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    public: bool = False,
    timeout: float = REQUEST_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
    deadline: float = DEADLINE,
) -> ExplorerServer:
    """A server for the explorer (not started); port 0 picks a free one. An address other
    than loopback is refused unless ``public``. ``timeout``: seconds a request has to arrive
    whole, and each write to a client; ``max_connections``: requests handled at once;
    ``deadline``: seconds a request may wait for the model and decode (then 503)."""
    explorer = Explorer(translator, deadline)
    handler = type("Handler", (_Handler,), {"explorer": explorer, "timeout": timeout})
    try:
        server = ExplorerServer((host, port), handler, max_connections)
    except OSError as e:
        raise Seq2SeqError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    if not (server.loopback or public):
        server.server_close()
        raise Seq2SeqError(
            f"{host} is not a loopback address: anyone who reaches it could use the explorer, "
            "which has no login; pass --public to serve it to the network anyway"
        )
    return server


def serve(
    run_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    device: str = DEFAULT_DEVICE,
    *,
    public: bool = False,
    deadline: float = DEADLINE,
) -> None:
    """Load the run, then serve the explorer until interrupted (Ctrl-C)."""
    translator = Translator.from_run(run_dir, device)
    server = make_server(translator, host, port, public=public, deadline=deadline)
    address, bound = server.server_address[:2]
    if not server.loopback:
        print(
            f"warning: {address} is reachable from the network and the explorer has no login: "
            "anyone who reaches it can make this machine decode",
            file=sys.stderr,
        )
    print(f"serving {run_dir} at http://{address}:{bound}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.server_close()
