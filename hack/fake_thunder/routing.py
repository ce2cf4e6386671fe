"""A tiny method + path-template router for the fake service's handlers."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hack.fake_thunder.messages import FakeRequest, FakeResponse, HttpError

Handler = Callable[[FakeRequest, dict[str, str]], FakeResponse]


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    pattern: re.Pattern[str]
    handler: Handler


def route(method: str, template: str, handler: Handler) -> Route:
    regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
    return Route(method, template, re.compile(f"^{regex}$"), handler)


class Router:
    def __init__(self, routes: Sequence[Route]) -> None:
        self._routes = list(routes)

    def dispatch(self, request: FakeRequest) -> FakeResponse | None:
        """The handler's answer; None if no route has this path; 405 for a wrong method."""
        path_known = False
        for candidate in self._routes:
            match = candidate.pattern.match(request.path)
            if match is None:
                continue
            path_known = True
            if candidate.method == request.method:
                try:
                    return candidate.handler(request, match.groupdict())
                except HttpError as error:
                    return error.response()
        if path_known:
            return HttpError(405, "MethodNotAllowed", f"{request.method} not allowed").response()
        return None
