"""An ASGI middleware that checks every request before a route sees it.

In order: the API key (401), the body size (413, from Content-Length and while reading),
and that the body is UTF-8 (400). The body is then handed on as JSON whatever its
Content-Type, so ``curl -d '{"texts": [...]}'`` works as it does with ``-H 'Content-Type: ...'``.
Unauthenticated clients never get their body read.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openstamp.service.auth import ApiKeys, bearer_token
from openstamp.service.page import PAGE_PATHS

PUBLIC_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}) | PAGE_PATHS
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class Guard:
    """Args: keys: accepted API keys, or None for anonymous access; max_body_bytes: body limit."""

    def __init__(self, app: ASGIApp, *, keys: ApiKeys | None, max_body_bytes: int) -> None:
        self.app, self.keys, self.max_body_bytes = app, keys, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self.keys is not None and not self.keys.check(bearer_token(headers.get("authorization"))):
            await _reply(
                scope,
                receive,
                send,
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
                {"WWW-Authenticate": "Bearer"},
            )
            return
        if scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            too_big = declared.isdigit()
            await _reply(
                scope,
                receive,
                send,
                413 if too_big else 400,
                self._too_big() if too_big else "invalid Content-Length header",
            )
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                await _reply(scope, receive, send, 413, self._too_big())
                return
            if not message.get("more_body", False):
                break
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as err:
            await _reply(
                scope,
                receive,
                send,
                400,
                f"the request body is not UTF-8 text (invalid byte at offset {err.start}); send JSON",
            )
            return
        await self.app(_as_json(scope), _replay(bytes(body), receive), send)

    def _too_big(self) -> str:
        return f"request body larger than the service's limit of {self.max_body_bytes} bytes"


async def _reply(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    detail: str,
    headers: dict[str, str] | None = None,
) -> None:
    await JSONResponse({"detail": detail}, status_code=status, headers=headers)(scope, receive, send)


def _as_json(scope: Scope) -> Scope:
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
