"""Who may see the dashboard: one-time login tokens, browser sessions, and their CSRF tokens (no I/O).

The way Jupyter does it, with the token good for one use: whoever can drive
the node through its cookie (``locomesh ui``) asks for a login token; the URL
carrying it, opened in a browser, trades it for a session, which the browser
keeps in an HttpOnly, SameSite=Strict cookie. Each session has a CSRF token
that the dashboard's pages send back in a header with every POST; a page of
another site can neither read it nor set that header without our consent
(which we never give: no CORS).

A limit we do not remove: browsers do not keep cookies apart by port, so any
other web server on 127.0.0.1 that the same browser visits is sent the session
cookie too (its name carries our port, which only avoids clashes), and could
read the dashboard with it until the session ends or the user logs out.

Tokens and session IDs are 32 random bytes; only their SHA-256 is kept, so
looking one up leaks nothing through timing. Both are bounded in number and
in age: past `MAX_TOKENS` or `MAX_SESSIONS` the oldest goes first. The clock
is injected (`now`, seconds), so the rules are tested without waiting.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

TOKEN_TTL = 600.0  # a login URL is good for 10 minutes, once
SESSION_TTL = 12 * 3600.0  # a browser stays logged in for 12 hours at most
MAX_TOKENS = 16
MAX_SESSIONS = 32
_RANDOM_BYTES = 32
_MAX_SECRET_LENGTH = 128  # longer input is no token of ours: refused before it is hashed


@dataclass(frozen=True)
class Session:
    """One logged-in browser: its CSRF token and when it expires."""

    csrf: str
    expires_at: float

    def csrf_matches(self, given: str | None) -> bool:
        """Whether `given` is this session's CSRF token (compared in constant time)."""
        return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), self.csrf.encode())


class LoginTokens:
    """One-time login tokens, each good for `ttl` seconds."""

    def __init__(self, *, now: Callable[[], float] = time.monotonic, ttl: float = TOKEN_TTL) -> None:
        self._now = now
        self._ttl = ttl
        self._expiry: OrderedDict[bytes, float] = OrderedDict()  # hash of a token -> when it expires

    def issue(self) -> str:
        """A new token (URL-safe text)."""
        self._forget_expired()
        token = secrets.token_urlsafe(_RANDOM_BYTES)
        self._expiry[_digest(token)] = self._now() + self._ttl
        while len(self._expiry) > MAX_TOKENS:
            self._expiry.popitem(last=False)
        return token

    def redeem(self, token: str | None) -> bool:
        """Whether `token` was issued, has not expired and was not redeemed before; it is used up either way."""
        if not token or len(token) > _MAX_SECRET_LENGTH:
            return False
        expires_at = self._expiry.pop(_digest(token), None)
        return expires_at is not None and self._now() < expires_at

    def _forget_expired(self) -> None:
        now = self._now()
        for key in [key for key, expires_at in self._expiry.items() if expires_at <= now]:
            del self._expiry[key]


class Sessions:
    """Logged-in browsers, by session ID."""

    def __init__(self, *, now: Callable[[], float] = time.monotonic, ttl: float = SESSION_TTL) -> None:
        self._now = now
        self.ttl = ttl
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()  # hash of a session ID -> session

    def open(self) -> tuple[str, Session]:
        """A new session: (its ID, for the cookie; the session)."""
        session_id = secrets.token_urlsafe(_RANDOM_BYTES)
        session = Session(csrf=secrets.token_urlsafe(_RANDOM_BYTES), expires_at=self._now() + self.ttl)
        self._sessions[_digest(session_id)] = session
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session with ID `session_id`, or None (an expired one is forgotten)."""
        if not session_id or len(session_id) > _MAX_SECRET_LENGTH:
            return None
        key = _digest(session_id)
        session = self._sessions.get(key)
        if session is not None and self._now() >= session.expires_at:
            del self._sessions[key]
            return None
        return session

    def close(self, session_id: str | None) -> None:
        """Log the session out (nothing happens if it does not exist)."""
        if session_id and len(session_id) <= _MAX_SECRET_LENGTH:
            self._sessions.pop(_digest(session_id), None)

    def __len__(self) -> int:
        return len(self._sessions)


def same_origin(origin: str | None, fetch_site: str | None, host: str) -> bool:
    """Whether a request that says it comes from `origin` (its ``Origin`` header) and `fetch_site`
    (``Sec-Fetch-Site``) was sent by a page of ours at `host`. Missing headers prove nothing either
    way (older browsers, scripts): the CSRF token is what decides then."""
    if fetch_site is not None and fetch_site.lower() != "same-origin":
        return False
    return origin is None or origin.lower() == f"http://{host}"


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "replace")).digest()
