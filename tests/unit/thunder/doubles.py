"""Test doubles for the Thunder client's unit tests: a fake clock, a recording
MockTransport handler and canned answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

API_TOKEN = "tcapi_unit_Very-Secret-API-token-0001"
BASE_URL = "https://thunder.test"


class FakeClock:
    """Monotonic time that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass
class Recorder:
    """A MockTransport handler that records requests and answers from a script."""

    answer: Callable[[httpx.Request], httpx.Response]
    requests: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answer(request)

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]

    def last_json(self) -> Any:
        return json.loads(self.last.content) if self.last.content else None


def sequence(*responses: httpx.Response | Exception) -> Callable[[httpx.Request], httpx.Response]:
    """Answer with each response in turn (raising exceptions), repeating the last."""
    queue = list(responses)

    def answer(request: httpx.Request) -> httpx.Response:
        item = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(item, Exception):
            raise item
        return item

    return answer


def respond(status: int = 200, body: Any = None, **kwargs: Any) -> httpx.Response:
    if body is None:
        return httpx.Response(status, **kwargs)
    if isinstance(body, bytes | str):
        return httpx.Response(status, content=body, **kwargs)
    return httpx.Response(status, json=body, **kwargs)
