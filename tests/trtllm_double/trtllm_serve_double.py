"""A stand-in for ``trtllm-serve``, driven by spectool's TensorRT-LLM release tables.

Run as ``python trtllm_serve_double.py MODEL [flags]`` with ``TRTLLM_DOUBLE_RELEASE`` naming the
release it imitates (``1.0``, ``1.1``, ``1.2``, ``main``). Like the real command it:

* refuses flags the release's ``trtllm-serve`` lacks (click: exit 2) and a ``--config`` YAML its
  ``StrictBaseModel`` classes reject (exit 1, the offending key path);
* binds an IPv4 socket before loading (``launch_server``: ``socket.AF_INET``), so ``::1`` fails
  with "Failed to bind socket";
* answers ``/health`` only after the (simulated) load, ``TRTLLM_DOUBLE_LOAD_S`` seconds;
* serves ``/metrics`` as a JSON list of iteration stats, drained on read (one per completion);
* honours a runtime gate only where the release does (:mod:`spectool.trtllm.gates`):
  ``GET /double/draft_len?batch=N`` answers the draft length the engine would use at batch N.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlparse

import yaml

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


def main(argv: list[str]) -> int:
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
    stats: list[dict] = []

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
                drained = list(stats)
                stats.clear()
                self._send(200, drained)
            elif url.path == "/double/draft_len":
                batch = int(parse_qs(url.query)["batch"][0])
                self._send(200, {"draft_len": draft_len(options, release, batch)})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(length)
            k = draft_len(options, release, 1)
            stats.append({"iterLatencyMS": 5.0, "numActiveRequests": 1, "draftLen": k})
            self._send(200, {"choices": [{"text": "ok"}], "usage": {"completion_tokens": 1}})

        def log_message(self, *_args: object) -> None:
            pass

    server = HTTPServer((host, port), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    sock.listen(16)
    print(f"Uvicorn running on http://{host}:{port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
