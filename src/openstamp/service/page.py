"""The detection page: GET / and its static files, served without a key.

They hold nothing secret; the page asks for the API key and sends it with each request to the API,
which checks it as it checks any client. Only these paths are public (see ``guard.PUBLIC_PATHS``).
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

JS = "text/javascript; charset=utf-8"
STATIC = {"page.css": "text/css; charset=utf-8", "page.js": JS, "pool.js": JS, "groups.js": JS}
PAGE_PATHS = frozenset({"/", *(f"/static/{name}" for name in STATIC)})
# same-origin scripts, styles and requests only; token colours are set through the DOM, not markup
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

router = APIRouter(include_in_schema=False)


@cache
def _read(name: str) -> bytes:
    return files("openstamp.service").joinpath("static", name).read_bytes()


@router.get("/")
def index() -> Response:
    return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC:  # a fixed list: no path from the request reaches the file system
        raise HTTPException(404, "not found")
    return Response(_read(name), media_type=STATIC[name], headers=HEADERS)
