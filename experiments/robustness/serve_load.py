"""``seq2seq serve`` under load, on 127.0.0.1 only: slow clients, many requests, the largest
request it allows; the server must keep answering and its memory stay bounded.

Starts ``seq2seq serve RUN --port 0`` (a tiny model trained on data/sample unless ``--run``;
``--shape default`` swaps in the default model shape, 3+3 layers of d_model 256, randomly
initialised: the memory of a request depends on the shape, not on the weights). Then:

1. ``--slow`` clients connect at once and send ``POST`` headers with ``Content-Length:
   65536`` and then nothing; while they hang, ``--requests`` ordinary requests are sent one
   after another (sentences of data/sample); then how long the server took to close each
   slow client, and the time a normal request takes afterwards (it must be under a second).
2. The largest request the limits let through: beam ``MAX_BEAM``, EOS banned so every
   output runs to max_len, max_len ``MAX_LEN`` (or the model's limit), a source as long as
   ``MAX_WEIGHTS`` then allows (ten sentences where one cannot fill it).

The server's resident memory is read from ``/proc/PID/status`` (VmRSS now, VmHWM the peak).
Every socket has a timeout and the whole script a deadline (``--deadline``, training the
tiny model included), at which it stops the server and exits non-zero.

    OMP_NUM_THREADS=1 python experiments/robustness/serve_load.py
    OMP_NUM_THREADS=1 python experiments/robustness/serve_load.py --shape default --slow 0 --requests 0
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
import time
from pathlib import Path
from urllib.parse import quote_plus

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from helpers import train_sample_run  # noqa: E402

from seq2seq.checkpoint import BEST_FILE, load_config_file, save_config, save_model  # noqa: E402
from seq2seq.config import ModelConfig  # noqa: E402
from seq2seq.model import build_model  # noqa: E402
from seq2seq.serve import MAX_BEAM, MAX_LEN, MAX_SENTENCES, MAX_WEIGHTS  # noqa: E402
from seq2seq.tokenizer import Tokenizer  # noqa: E402

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

    def __init__(self, run: Path, log: Path) -> None:
        command = [sys.executable, "-m", "seq2seq", "serve", str(run), "--port", "0"]
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


def largest_request(run: Path) -> tuple[dict[str, str], dict]:
    """The form of the largest request the cap allows: the longest output everywhere, and
    the longest source that then fits (``MAX_SENTENCES`` of the model's limit where one
    sentence cannot fill the cap)."""
    config, tok = load_config_file(run), Tokenizer.load(run)
    m = config.model
    max_len, per_cell = min(MAX_LEN, m.max_positions - 1), m.n_dec_layers * m.n_heads
    longest_src = MAX_WEIGHTS // (per_cell * max_len) - 1  # subwords, EOS not counted
    words = ["ein", "Hund", "läuft", "über", "die", "Wiese", "und"] * max_len  # enough words
    n = 1
    while len(tok.encode(" ".join(words[: n + 1]), "src")) <= min(longest_src, max_len):
        n += 1
    sentence = " ".join(words[:n])
    s = min(len(tok.encode(sentence, "src")), max_len) + 1
    k = max(1, min(MAX_SENTENCES, MAX_WEIGHTS // (per_cell * max_len * s)))
    form = {"text": "\n".join([sentence] * k), "beam": str(MAX_BEAM), "max_len": str(max_len),
            "ban_eos": "on"}  # fmt: skip
    shape = {"sentences": k, "source_positions": s, "max_len": max_len, "beam": MAX_BEAM,
             "layers_x_heads": per_cell, "weights": k * s * max_len * per_cell}  # fmt: skip
    return form, shape


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a trained run (default: train a tiny one)")
    parser.add_argument("--shape", choices=("run", "default"), default="run")
    parser.add_argument("--slow", type=int, default=50, help="slow clients (default: 50)")
    parser.add_argument("--requests", type=int, default=200, help="sequential (default: 200)")
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
    with Server(run, args.out / "server.log") as server:
        results["started"] = server.memory_mb()
        if args.slow or args.requests:
            results["load"] = load_phase(server, args, sentences)
            print("load", json.dumps(results["load"]), flush=True)
        form, results["largest_shape"] = largest_request(run)
        status, seconds = request(server.port, form, max(1.0, args.end - time.monotonic()))
        results["largest"] = {"status": status, "seconds": round(seconds, 1), **server.memory_mb()}
        print("largest", json.dumps(results["largest_shape"]), json.dumps(results["largest"]))
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    load = results.get("load", {"normal_request_after": {"status": 200, "seconds": 0}})
    after = load["normal_request_after"]
    ok = after["status"] == 200 and after["seconds"] < 1 and results["largest"]["status"] == 200
    print("ok" if ok else "FAILED", "- results in", args.out / "results.json")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
