"""Helpers shared by the server tests: SSE parsing, waiting for health, a live uvicorn server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI

from spectool.server.driver import AsyncEngine
from spectool.server.run import serve_in_thread

HEALTH_DEADLINE_S = 60.0


def sse_events(lines: Iterable[str]) -> list[Any]:
    """``data:`` payloads of a server-sent-events body, JSON-decoded; ``[DONE]`` kept as str."""
    events: list[Any] = []
    for line in lines:
        if not line.startswith("data: "):
            assert line == "", f"unexpected SSE line {line!r}"
            continue
        data = line[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def wait_healthy(get: Any, deadline_s: float = HEALTH_DEADLINE_S) -> None:
    """Poll ``get("/health")`` until 200; fail after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if get("/health").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError("server did not become healthy in time")


@dataclass
class LiveServer:
    """A real uvicorn server on 127.0.0.1 running in a thread of the test process."""

    app: FastAPI
    url: str
    thread: threading.Thread
    server: Any

    @property
    def driver(self) -> AsyncEngine:
        driver = self.app.state.spectool.driver
        assert driver is not None
        return driver

    def stop(self, timeout_s: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "uvicorn did not stop"


def start_live_server(app: FastAPI) -> LiveServer:
    server, thread, url = serve_in_thread(app, name="uvicorn-test")
    live = LiveServer(app=app, url=url, thread=thread, server=server)
    with httpx.Client(base_url=live.url, timeout=5.0) as client:

        def get(path: str) -> httpx.Response:
            try:
                return client.get(path)
            except httpx.TransportError:  # not listening yet
                return httpx.Response(599)

        wait_healthy(get)
    return live
