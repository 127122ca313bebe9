"""The dashboard's HTTP routes: login, the pages, their assets, and the read-only JSON-RPC they poll.

    GET  /login?token=T     trade a one-time token for a session cookie, then open /
    GET  /, /peers, /runs, /runs/<id>, /downloads     the page shell (needs the session)
    GET  /static/<name>     its scripts and style (need the session)
    POST /api/rpc           JSON-RPC over the dashboard's read-only methods (session + CSRF token)
    POST /logout            end the session (session + CSRF token)

Every route needs the session but /login; every POST needs the session's CSRF
token in ``X-CSRF-Token`` and, when the browser says where it comes from
(``Origin``, ``Sec-Fetch-Site``), to come from our own pages. The session
cookie is named after our port: cookies ignore ports, and two daemons on one
machine must not log each other out. Responses forbid framing, sniffing and
referrers (the login URL carries a token), and allow scripts from us only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from locomesh.node.dashboard.auth import Session, same_origin
from locomesh.node.rpc.app import read_body, refusal

if TYPE_CHECKING:
    from locomesh.node.dashboard.app import Dashboard

PAGES = ("/", "/peers", "/runs", "/runs/{run_id}", "/downloads")
MAX_API_BODY = 64 * 1024
CSRF_HEADER = "x-csrf-token"
_CONTENT_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_LOGGED_IN = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="0; url=/"><title>locomesh: logged in</title></head>
<body><p>Logged in. <a href="/">Open the dashboard</a>.</p></body></html>"""
_REFUSED = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>locomesh: {title}</title></head>
<body><h1>{title}</h1><p>{text}</p></body></html>"""
_LOG_IN_FIRST = "Run <code>locomesh ui</code> on this machine and open the login URL it prints."
_NEW_LINK = "Each login URL works once, for 10 minutes: run <code>locomesh ui</code> for a new one."


@dataclass(frozen=True)
class Assets:
    """The page shell (HTML with a ``{{csrf}}`` slot) and the static files, read once from the package."""

    shell: str
    files: dict[str, tuple[bytes, str]]  # name -> (content, content type)

    @classmethod
    def load(cls) -> Assets:
        """The shell and every file of a known type in the package's ``static`` folder."""
        folder = resources.files("locomesh.node.dashboard") / "static"
        files = {}
        for entry in folder.iterdir():
            content_type = _CONTENT_TYPES.get("." + entry.name.rpartition(".")[2])
            if content_type is not None:
                files[entry.name] = (entry.read_bytes(), content_type)
        return cls(shell=(folder / "index.html").read_text("utf-8"), files=files)


class Routes:
    """The endpoints, over `dashboard`'s sessions, tokens and read-only dispatcher."""

    def __init__(self, dashboard: Dashboard, assets: Assets, on_reject: Callable[[str], None]) -> None:
        self.dashboard = dashboard
        self.assets = assets
        self.on_reject = on_reject

    def all(self) -> list[BaseRoute]:
        pages = [Route(path, self.page, methods=["GET"]) for path in PAGES]
        return [
            *pages,
            Route("/login", self.login, methods=["GET"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/api/rpc", self.api, methods=["POST"]),
            Route("/static/{name}", self.static, methods=["GET"]),
        ]

    @property
    def cookie_name(self) -> str:
        return f"locomesh_session_{self.dashboard.port}"

    async def login(self, request: Request) -> Response:
        """Trade the token in the query for a session; the page then opens / (a navigation of our own,
        so the SameSite=Strict cookie goes with it, however the login link was opened)."""
        if not self.dashboard.tokens.redeem(request.query_params.get("token")):
            self.on_reject("bad-token")
            return _refused(403, "Login link used or expired", _NEW_LINK)
        session_id, _session = self.dashboard.sessions.open()
        response = HTMLResponse(_LOGGED_IN, headers=HEADERS)
        response.set_cookie(
            self.cookie_name, session_id, max_age=int(self.dashboard.sessions.ttl), path="/",
            httponly=True, samesite="strict",
        )
        return response

    async def page(self, request: Request) -> Response:
        """The page shell with the session's CSRF token in it (its script draws the page); 401 without a session."""
        session = self._session(request)
        if session is None:
            return _refused(401, "Not logged in", _LOG_IN_FIRST)
        return HTMLResponse(self.assets.shell.replace("{{csrf}}", session.csrf), headers=HEADERS)

    async def static(self, request: Request) -> Response:
        """A file of `Assets` by name (404 if none); 401 without a session."""
        if self._session(request) is None:
            return _refused(401, "Not logged in", _LOG_IN_FIRST)
        found = self.assets.files.get(request.path_params["name"])
        if found is None:
            return refusal(404, "no such file")
        content, content_type = found
        return Response(content, media_type=content_type, headers=HEADERS)

    async def api(self, request: Request) -> Response:
        """A JSON-RPC request (of at most MAX_API_BODY bytes) to the read-only dispatcher, if `_check_post` lets it."""
        refused = self._check_post(request)
        if refused is not None:
            return refused
        answer = await self.dashboard.dispatcher.handle(await read_body(request, limit=MAX_API_BODY))
        if answer is None:
            return Response(status_code=204, headers=HEADERS)
        return Response(answer, media_type="application/json", headers=HEADERS)

    async def logout(self, request: Request) -> Response:
        """End the session and delete its cookie, if `_check_post` lets this POST through."""
        refused = self._check_post(request)
        if refused is not None:
            return refused
        self.dashboard.sessions.close(request.cookies.get(self.cookie_name))
        response = Response('{"logged_out":true}', media_type="application/json", headers=HEADERS)
        response.delete_cookie(self.cookie_name, path="/", httponly=True, samesite="strict")
        return response

    def _session(self, request: Request) -> Session | None:
        session = self.dashboard.sessions.get(request.cookies.get(self.cookie_name))
        if session is None:
            self.on_reject("no-session")
        return session

    def _check_post(self, request: Request) -> Response | None:
        """None if this POST may go on; else the refusal to answer (401 without a session, 403 from
        another site or without the session's CSRF token)."""
        session = self._session(request)
        if session is None:
            return refusal(401, "not logged in: run `locomesh ui` for a login URL")
        host = request.headers.get("host", "").lower()
        if not same_origin(request.headers.get("origin"), request.headers.get("sec-fetch-site"), host):
            self.on_reject("cross-site")
            return refusal(403, "a request from another site")
        if not session.csrf_matches(request.headers.get(CSRF_HEADER)):
            self.on_reject("csrf")
            return refusal(403, "missing or wrong CSRF token")
        return None


def _refused(status: int, title: str, text: str) -> Response:
    return HTMLResponse(_REFUSED.format(title=title, text=text), status_code=status, headers=HEADERS)
