"""A stand-in for ``trtllm-serve``, driven by spectool's TensorRT-LLM release tables.

Run as ``python trtllm_serve_double.py MODEL [flags]`` with ``TRTLLM_DOUBLE_RELEASE`` naming the
release it imitates (``1.0``, ``1.1``, ``1.2``, ``main``). Like the real command it:

* refuses flags the release's ``trtllm-serve`` lacks (click: exit 2) and a ``--config`` YAML its
  ``StrictBaseModel`` classes reject (exit 1, the offending key path);
* binds an IPv4 socket before loading (``launch_server``: ``socket.AF_INET``), so ``::1`` fails
  with "Failed to bind socket";
* answers ``/health`` only after the (simulated) load, ``TRTLLM_DOUBLE_LOAD_S`` seconds;
* serves ``/metrics`` as a JSON list of iteration stats, drained on read: one per iteration of
  its engine (:mod:`double_engine`) for streamed completions, one per plain completion;
* streams completions (``stream: true``) token by token from that engine, the usage in every
  chunk, and lists the model at ``/v1/models``;
* logs ``double: started``/``ready``/``stopped`` lines with wall-clock times, the draft length,
  ``CUDA_VISIBLE_DEVICES`` and the Slurm job and step it ran in (tests read lifetimes from them);
* honours a runtime gate only where the release does (:mod:`spectool.trtllm.gates`):
  ``GET /double/draft_len?batch=N`` answers the draft length the engine would use at batch N;
* ``GET /double/options`` answers the options it loaded from ``--config``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import yaml
from double_engine import Engine

from spectool.errors import ConfigError
from spectool.trtllm.gates import gate_support
from spectool.trtllm.releases import release_info
from spectool.trtllm.validate import validate_options

METHODS = {
    "Eagle": "eagle3",
    "Eagle3": "eagle3",
    "MTP": "mtp",
    "DraftTarget": "draft_model",
    "Draft_Target": "draft_model",
    "NGram": "ngram",
}


def draft_len(options: dict, release: str, batch: int) -> int:
    """Draft length at ``batch``: the gate applies only where the release honours it."""
    spec = options.get("speculative_config")
    if not spec:
        return 0
    depth = spec.get("max_draft_len", 0)
    method = METHODS.get(spec["decoding_type"], "eagle3")
    support = gate_support(release, method, two_model=spec.get("eagle3_one_model") is False)
    mc, schedule = spec.get("max_concurrency"), spec.get("draft_len_schedule")
    if mc is not None and support.max_concurrency:
        return depth if batch <= mc else 0
    if schedule and support.draft_len_schedule:
        keys = sorted(schedule)
        if release_info(release).schedule_rule == "smallest_key":  # upper bounds
            return next((schedule[k] for k in keys if batch <= k), 0)
        return schedule[max(k for k in keys if k <= batch)]  # lower bounds, key 1 present
    return depth


def _log(event: str, **fields: object) -> None:
    where = {
        "pid": os.getpid(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "-"),
        "SLURM_JOB_ID": os.environ.get("SLURM_JOB_ID", "-"),
        "SLURM_STEP_ID": os.environ.get("SLURM_STEP_ID", "-"),
    }
    text = " ".join(f"{k}={v}" for k, v in {**fields, **where}.items())
    print(f"double: {event} t={time.time():.3f} {text}", flush=True)


def main(argv: list[str]) -> int:
    _log("started")
    release = os.environ["TRTLLM_DOUBLE_RELEASE"]
    info = release_info(release)
    parser = argparse.ArgumentParser(prog="trtllm-serve")
    parser.add_argument("model")
    for flag in sorted(info.serve_flags):
        parser.add_argument(flag)
    args = parser.parse_args(argv)  # unknown flag: exit 2, like click
    opts = vars(args)
    config = opts.get(info.serve_config_flag.lstrip("-"))
    backend = opts.get("backend") or info.default_backend
    options: dict = {}
    if config:
        with open(config, encoding="utf-8") as f:
            options = yaml.safe_load(f) or {}
        try:
            validate_options(options, release, backend, use_installed=False)
        except ConfigError as exc:
            print(f"pydantic_core.ValidationError: {exc}", file=sys.stderr)
            return 1
    host, port = opts.get("host") or "localhost", int(opts.get("port") or 8000)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError as exc:
        print(f"RuntimeError: Failed to bind socket to {host}:{port}: {exc}", file=sys.stderr)
        return 1
    time.sleep(float(os.environ.get("TRTLLM_DOUBLE_LOAD_S", "0.2")))  # loading the model
    engine = Engine(lambda batch: draft_len(options, release, batch))

    def stopped(_signum: int, _frame: object) -> None:
        _log("stopped")
        os._exit(0)

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            url = urlparse(self.path)
            if url.path == "/health":
                self._send(200, {})
            elif url.path == "/metrics":
                self._send(200, engine.drain())
            elif url.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": args.model}]})
            elif url.path == "/double/options":
                self._send(200, options)
            elif url.path == "/double/draft_len":
                batch = int(parse_qs(url.query)["batch"][0])
                self._send(200, {"draft_len": draft_len(options, release, batch)})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            if body.get("stream"):
                self._stream(body)
                return
            k = draft_len(options, release, 1)
            with engine.lock:
                engine.stats.append({"iterLatencyMS": 5.0, "numActiveRequests": 1, "draftLen": k})
            self._send(200, {"choices": [{"text": "ok"}], "usage": {"completion_tokens": 1}})

        def _stream(self, body: dict) -> None:
            prompt = body.get("prompt") or json.dumps(body.get("messages"), sort_keys=True)
            chat = "messages" in body
            request = engine.submit(str(prompt), int(body.get("max_tokens") or 16))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            usage = {"prompt_tokens": len(str(prompt).split()), "completion_tokens": 0}
            while (n := request.out.get()) is not None:
                usage["completion_tokens"] += n
                text = "tok " * n
                choice = (
                    {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                )
                self._event({"choices": [{**choice, "finish_reason": None}], "usage": usage})
            self._event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                         "usage": usage})  # fmt: skip
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _event(self, obj: dict) -> None:
            self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
            self.wfile.flush()

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    sock.listen(16)
    print(f"Uvicorn running on http://{host}:{port}", flush=True)
    _log("ready", draft_len=draft_len(options, release, 1), port=port)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
