"""The fake Thunder service: routing, auth-neutral plumbing, faults and the write log.

Use it in-process through :meth:`FakeThunder.transport` (an ``httpx.MockTransport``), or as
a process through ``python -m hack.fake_thunder`` (``server.py``); both run this code.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from typing import Any

import httpx

from hack.fake_thunder.admin_api import AdminApi
from hack.fake_thunder.artifact_host import ARTIFACT_PREFIX, ArtifactHost
from hack.fake_thunder.faults import FaultBook
from hack.fake_thunder.messages import FakeRequest, FakeResponse, HttpError
from hack.fake_thunder.public_api import PublicApi
from hack.fake_thunder.routing import Router
from hack.fake_thunder.state import ApiToken, FakeState, format_time
from hack.fake_thunder.switches import Switches

ADMIN_PREFIX = "/_admin/"
MASK = "**********"

_log = logging.getLogger("hack.fake_thunder")


class FakeThunder:
    """One organisation's Thunder, in memory. ``seed`` uses the state dump format."""

    def __init__(self, *, api_tokens: Iterable[str] = (), seed: dict[str, Any] | None = None):
        self._initial_tokens = {t: ApiToken(t) for t in api_tokens}
        self._seed = seed
        self.state = FakeState()
        self.switches = Switches()
        self.faults = FaultBook()
        self.writes: list[dict[str, Any]] = []
        self.downloads: list[dict[str, Any]] = []
        self.reset()
        self._public = Router([*PublicApi(self).routes(), *ArtifactHost(self).routes()])
        self._admin = Router(AdminApi(self).routes())

    def reset(self) -> None:
        """Back to the state the service started with: seed and start-up tokens only."""
        if self._seed is not None:
            self.state = FakeState.load(self._seed, keep_api_tokens={})
        else:
            self.state = FakeState()
        self.state.api_tokens.update(self._initial_tokens)
        self.switches = Switches()
        if self._seed is not None and self._seed.get("switches"):
            self.switches.update(self._seed["switches"])
        self.faults = FaultBook()
        self.writes.clear()
        self.downloads.clear()

    def transport(self) -> httpx.MockTransport:
        """An httpx transport that answers from this object, for in-process tests."""

        async def handle(request: httpx.Request) -> httpx.Response:
            fake = FakeRequest(
                method=request.method,
                path=request.url.path,
                query={key: request.url.params[key] for key in request.url.params},
                headers={k.lower(): v for k, v in request.headers.items()},
                body=request.content,
                base_url=f"{request.url.scheme}://{request.url.netloc.decode('ascii')}",
            )
            answer = await self.handle(fake)
            return httpx.Response(answer.status, content=answer.body, headers=answer.headers)

        return httpx.MockTransport(handle)

    async def handle(self, request: FakeRequest) -> FakeResponse:
        if request.path.startswith(ADMIN_PREFIX):
            answer = self._admin.dispatch(request)
            return answer or HttpError(404, "NotFound", "no such admin endpoint").response()
        rule = self.faults.take(request.method, request.path, _body_zone(request))
        if rule is not None and rule.latency_ms:
            await asyncio.sleep(rule.latency_ms / 1000)
        if rule is not None and rule.status is not None and not rule.after:
            answer = rule.response()
        else:
            answer = self._public.dispatch(request) or (
                HttpError(404, "NotFound", "no such endpoint").response()
            )
            if rule is not None and rule.status is not None:
                answer = rule.response()
        self._record(request, answer, rule.rule_id if rule is not None else None)
        _log.debug(
            "fake thunder request",
            extra={"method": request.method, "path": request.path, "status": answer.status},
        )
        return answer

    def _record(self, request: FakeRequest, answer: FakeResponse, fault: str | None) -> None:
        when = format_time(self.state.now())
        user_agent = request.headers.get("user-agent")
        if request.path.startswith(ARTIFACT_PREFIX + "/"):
            entry = {"time": when, "path": request.path, "status": answer.status}
            self.downloads.append(entry | {"userAgent": user_agent, "fault": fault})
            return
        if request.method in ("GET", "HEAD"):
            return
        kind, token_id = self.credential_of(request)
        self.writes.append(
            {
                "seq": len(self.writes) + 1,
                "time": when,
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "body": self._scrubbed(request.body_for_log()),
                "status": answer.status,
                "userAgent": user_agent,
                "credential": kind,
                "enrollmentTokenId": token_id,
                "fault": fault,
            }
        )

    def credential_of(self, request: FakeRequest) -> tuple[str, str | None]:
        """``api-token``, ``enrollment-token`` (with its ID), ``unknown`` or ``none``."""
        bearer = request.bearer()
        if bearer is None:
            return ("none" if "authorization" not in request.headers else "unknown"), None
        if bearer in self.state.api_tokens:
            return "api-token", None
        token = self.state.token_by_secret(bearer)
        if token is not None:
            return "enrollment-token", token.token_id
        return "unknown", None

    def _secret_values(self) -> list[str]:
        values = list(self.state.api_tokens)
        values += [t.secret for t in self.state.tokens.values()]
        values += [c.auth_token for c in self.state.clients.values()]
        return [v for v in values if v]

    def _scrubbed(self, body: Any) -> Any:
        """The body with any credential the service knows masked: the log never holds one."""
        if body is None:
            return None
        text = json.dumps(body)
        for value in self._secret_values():
            text = text.replace(json.dumps(value)[1:-1], MASK)
        return json.loads(text)


def _body_zone(request: FakeRequest) -> str | None:
    """The ``zoneId`` a request's JSON body names (a mint's zone), for zone-bound faults."""
    if not request.body.strip().startswith(b"{"):
        return None
    try:
        zone = json.loads(request.body).get("zoneId")
    except ValueError:
        return None
    return zone if isinstance(zone, str) else None
