"""``seq2seq serve`` under load, on 127.0.0.1 only: slow clients, many requests, the largest
requests it allows, alone and many at once; the server must keep answering, within its
deadline, and its memory stay bounded.

Starts ``seq2seq serve RUN --port 0`` (a tiny model trained on data/sample unless ``--run``;
``--shape default`` swaps in the default model shape, 3+3 layers of d_model 256, randomly
initialised: the memory of a request depends on the shape, not on the weights). Then:

1. ``--slow`` clients connect at once and send ``POST`` headers with ``Content-Length:
   65536`` and then nothing; while they hang, ``--requests`` ordinary requests are sent one
   after another (sentences of data/sample); then how long the server took to close each
   slow client, and the time a normal request takes afterwards (it must be under a second).
2. The largest requests the work cap (``Explorer.work``, ``MAX_WEIGHTS``) lets through, two
   ways: all of it spent on the beam (``MAX_BEAM``), or on influence (greedy, one occlusion
   pass per source subword); EOS banned so every output runs to max_len, max_len ``MAX_LEN``
   (or the model's limit), a source as long as the cap then allows, and as many such
   sentences as fit (at most ``MAX_SENTENCES``). Each alone, one after the other.
3. ``--concurrent`` clients at once, each sending one of those two largest requests: each
   must get the page or 503 (busy) no later than a few seconds past the server's
   ``--server-deadline``, the server's peak memory must stay near that of one largest
   request (one request decodes at a time), and a normal request must be answered after.

The server's resident memory is read from ``/proc/PID/status`` (VmRSS now, VmHWM the peak).
Every socket has a timeout and the whole script a deadline (``--deadline``, training the
tiny model included), at which it stops the server and exits non-zero.

    OMP_NUM_THREADS=1 python experiments/robustness/serve_load.py
    OMP_NUM_THREADS=1 python experiments/robustness/serve_load.py --shape default --slow 0 --requests 0
    OMP_NUM_THREADS=1 python experiments/robustness/serve_load.py --slow 0 --requests 0 \
        --concurrent 8 --server-deadline 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote_plus

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from helpers import train_sample_run  # noqa: E402

from seq2seq.config import ModelConfig  # noqa: E402
from seq2seq.decoding.translate import Translator  # noqa: E402
from seq2seq.explorer.live import (  # noqa: E402
    DEADLINE,
    MAX_BEAM,
    MAX_LEN,
    MAX_SENTENCES,
    MAX_WEIGHTS,
    Explorer,
)
from seq2seq.model.transformer import build_model  # noqa: E402
from seq2seq.run.checkpoint import BEST_FILE, load_config_file, save_config, save_model  # noqa: E402

HOST = "127.0.0.1"  # never anything else: this script attacks the server it starts


def default_shape_run(tiny: Path, out: Path) -> Path:
    """A copy of ``tiny`` with the default model shape (its vocabulary kept), randomly
    initialised."""
    run = out / "default_shape"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(tiny, run, ignore=shutil.ignore_patterns("checkpoints", "*.safetensors"))
    config = load_config_file(run)
    vocab = {
        "src_vocab_size": config.model.src_vocab_size,
        "tgt_vocab_size": config.model.tgt_vocab_size,
    }
    config.model = dataclasses.replace(ModelConfig(), **vocab)
    save_config(run, config)
    save_model(build_model(config.model), run / BEST_FILE, {})
    return run


class Server:
    """``seq2seq serve RUN`` on a free port of 127.0.0.1, stopped on exit."""

    def __init__(self, run: Path, log: Path, deadline: float) -> None:
        command = [sys.executable, "-m", "seq2seq", "serve", str(run), "--port", "0"]
        command += ["--deadline", str(deadline)]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(log, "w") as stderr:
            self.proc = subprocess.Popen(
                [*command, "--host", HOST, "--device", "cpu"],
                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
            )  # fmt: skip
        line = self.proc.stdout.readline()  # printed once it listens (or empty if it died)
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if not found:
            self.proc.kill()
            raise SystemExit(f"the server did not start: {line!r}; see {log}")
        self.port = int(found.group(1))

    def memory_mb(self) -> dict[str, float]:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        kb = {k: int(v) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M)}
        return {"rss_mb": round(kb["VmRSS"] / 1024, 1), "peak_rss_mb": round(kb["VmHWM"] / 1024, 1)}

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def request(port: int, fields: dict[str, str], timeout: float) -> tuple[int, float]:
    """POST the form ``fields``; status and seconds to the whole answer."""
    body = "&".join(f"{k}={quote_plus(v)}" for k, v in fields.items()).encode()
    head = (
        f"POST / HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Length: {len(body)}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nConnection: close\r\n\r\n"
    )
    began = time.monotonic()
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(head.encode() + body)
        answer = b"".join(iter(lambda: sock.recv(1 << 16), b""))
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return status, time.monotonic() - began


def slow_clients(port: int, n: int) -> list[socket.socket]:
    """``n`` connections that promise a 64 KiB body and send none of it."""
    head = f"POST / HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Length: 65536\r\n\r\n".encode()
    clients = []
    for _ in range(n):
        sock = socket.create_connection((HOST, port), timeout=10)
        sock.sendall(head)
        clients.append(sock)
    return clients


class Closings:
    """When the server closes each of some connections (seconds since ``began``), noted
    whenever ``note`` is called."""

    def __init__(self, clients: list[socket.socket], began: float) -> None:
        self.began, self.at = began, []
        self.selector = selectors.DefaultSelector()
        for sock in clients:
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)

    def note(self, wait: float = 0.0) -> None:
        for key, _ in self.selector.select(wait):
            try:
                if key.fileobj.recv(4096):  # a response, if any, before the end
                    continue
            except OSError:  # reset by the server: closed too
                pass
            self.at.append(round(time.monotonic() - self.began, 2))
            self.selector.unregister(key.fileobj)
            key.fileobj.close()

    def wait(self, until: float) -> list[float]:
        """Every closing time, inf for connections still open at ``until``."""
        while self.selector.get_map() and time.monotonic() < until:
            self.note(wait=until - time.monotonic())
        left = len(self.selector.get_map())
        return self.at + [float("inf")] * left


def load_phase(server: Server, args: argparse.Namespace, sentences: list[str]) -> dict:
    began = time.monotonic()
    closings = Closings(slow_clients(server.port, args.slow), began)
    statuses: dict[int, int] = {}
    latencies = []
    for i in range(args.requests):
        status, seconds = request(server.port, {"text": sentences[i % len(sentences)]}, 30)
        statuses[status] = statuses.get(status, 0) + 1
        latencies.append(seconds)
        closings.note()
    closed = closings.wait(until=min(args.end, time.monotonic() + 60))
    after_status, after_s = request(server.port, {"text": sentences[0]}, 30)
    return {
        "slow_clients": args.slow,
        "requests": args.requests,
        "statuses": statuses,
        "median_s": round(statistics.median(latencies), 3) if latencies else None,
        "max_s": round(max(latencies), 3) if latencies else None,
        "slow_clients_closed_after_s": {
            "min": min(closed, default=None),
            "max": max(closed, default=None),
        },  # fmt: skip
        "normal_request_after": {"status": after_status, "seconds": round(after_s, 3)},
        **server.memory_mb(),
    }


def largest_requests(run: Path) -> dict[str, tuple[dict[str, str], dict]]:
    """The forms of the largest requests the cap allows, by beam and by influence: the
    longest output everywhere, the longest source that then fits, and as many of it as fit
    (at most ``MAX_SENTENCES``); each with its shape. The cap's own count decides
    (``Explorer.work``)."""
    explorer = Explorer(Translator.from_run(run, "cpu"))
    tok, m = explorer.translator.tokenizer, explorer.translator.model.config
    max_len = min(MAX_LEN, m.max_positions - 1)
    words = ["ein", "Hund", "läuft", "über", "die", "Wiese", "und"] * max_len  # enough words
    requests = {}
    for name, beam, influence in [("beam", MAX_BEAM, False), ("influence", 1, True)]:

        def work(sentence: str, k: int = 1, beam=beam, influence=influence) -> int:
            return explorer.work([sentence] * k, max_len, beam, influence)

        n = 1
        while (
            len(tok.encode(" ".join(words[: n + 1]), "src")) <= explorer.translator.max_src_len
            and work(" ".join(words[: n + 1])) <= MAX_WEIGHTS
        ):
            n += 1
        sentence = " ".join(words[:n])
        k = max([1, *(k for k in range(1, MAX_SENTENCES + 1) if work(sentence, k) <= MAX_WEIGHTS)])
        form = {"text": "\n".join([sentence] * k), "beam": str(beam), "max_len": str(max_len),
                "ban_eos": "on", **({"influence": "on"} if influence else {})}  # fmt: skip
        shape = {"sentences": k, "source_subwords": len(tok.encode(sentence, "src")) + 1,
                 "max_len": max_len, "beam": beam, "influence": influence,
                 "layers_x_heads": m.n_dec_layers * m.n_heads, "weights": work(sentence, k),
                 "cap": MAX_WEIGHTS}  # fmt: skip
        requests[name] = form, shape
    return requests


def concurrent_phase(server: Server, forms: list[dict[str, str]], n: int, timeout: float) -> dict:
    """``n`` clients at once, client i sending ``forms[i % len(forms)]``: each one's status
    and seconds to its answer, then the server's memory and a normal request."""
    answers: list[tuple[int, float]] = []

    def client(form: dict[str, str]) -> None:
        try:
            answers.append(request(server.port, form, timeout))
        except OSError:
            answers.append((0, timeout))  # no answer in time

    threads = [threading.Thread(target=client, args=(forms[i % len(forms)],)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    statuses: dict[int, int] = {}
    for status, _ in answers:
        statuses[status] = statuses.get(status, 0) + 1
    after_status, after_s = request(server.port, {"text": "Ein Hund"}, 30)
    return {
        "clients": n,
        "statuses": statuses,
        "max_s": {
            str(code): round(max(s for c, s in answers if c == code), 2) for code in statuses
        },
        "normal_request_after": {"status": after_status, "seconds": round(after_s, 3)},
        **server.memory_mb(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a trained run (default: train a tiny one)")
    parser.add_argument("--shape", choices=("run", "default"), default="run")
    parser.add_argument("--slow", type=int, default=50, help="slow clients (default: 50)")
    parser.add_argument("--requests", type=int, default=200, help="sequential (default: 200)")
    parser.add_argument(
        "--concurrent", type=int, default=8, help="largest requests at once (default: 8)"
    )
    parser.add_argument(
        "--server-deadline",
        type=float,
        default=DEADLINE,
        help=f"the server's --deadline, seconds (default: {DEADLINE:g})",
    )
    parser.add_argument("--deadline", type=float, default=900, help="seconds, all in")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "serve-load")
    args = parser.parse_args()
    args.end = time.monotonic() + args.deadline
    signal.signal(signal.SIGALRM, lambda *_: sys.exit(f"stopped: {args.deadline:.0f} s passed"))
    signal.alarm(max(1, round(args.deadline)))  # SystemExit: the server is stopped on the way
    args.out.mkdir(parents=True, exist_ok=True)
    run = args.run or train_sample_run(
        args.out / "tiny", steps=300, validate_every=300, lr=3e-3, n_dec_layers=2
    )
    if args.shape == "default":
        run = default_shape_run(run, args.out)
    sentences = (REPO / "data/sample/test.de").read_text(encoding="utf-8").splitlines()
    results: dict = {"run": str(run)}
    largest = largest_requests(run)
    with Server(run, args.out / "server.log", args.server_deadline) as server:
        results["started"] = server.memory_mb()
        if args.slow or args.requests:
            results["load"] = load_phase(server, args, sentences)
            print("load", json.dumps(results["load"]), flush=True)
        for name, (form, shape) in largest.items():
            status, seconds = request(server.port, form, max(1.0, args.end - time.monotonic()))
            done = {"status": status, "seconds": round(seconds, 1), **server.memory_mb()}
            results[f"largest_{name}"] = {"shape": shape, **done}
            print(f"largest by {name}", json.dumps(shape), json.dumps(done), flush=True)
        if args.concurrent:
            forms = [form for form, _ in largest.values()]
            timeout = args.server_deadline + 60  # past the deadline: the page's rendering
            results["concurrent"] = concurrent_phase(server, forms, args.concurrent, timeout)
            print("concurrent", json.dumps(results["concurrent"]), flush=True)
    results["server_deadline_s"] = args.server_deadline
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print("ok" if passed(results) else "FAILED", "- results in", args.out / "results.json")
    return 0 if passed(results) else 1


def passed(results: dict) -> bool:
    """Every check of the module's docstring: answers after the load, the largest requests
    answered alone (200, or 503 when they take longer than the deadline), every concurrent
    client answered within a few seconds of the deadline, and memory near one request's."""
    ok = True
    for phase in ("load", "concurrent"):
        after = results.get(phase, {}).get("normal_request_after", {"status": 200, "seconds": 0})
        ok &= after["status"] == 200 and after["seconds"] < 1
    ok &= all(results[f"largest_{k}"]["status"] in (200, 503) for k in ("beam", "influence"))
    if "concurrent" in results:
        c, deadline = results["concurrent"], results["server_deadline_s"]
        ok &= set(c["statuses"]) <= {200, 503} and c["max_s"].get("503", 0) < deadline + 5
        alone = max(results[f"largest_{k}"]["peak_rss_mb"] for k in ("beam", "influence"))
        ok &= c["peak_rss_mb"] < 1.5 * alone
    return bool(ok)


if __name__ == "__main__":
    sys.exit(main())
