"""The dashboard over real HTTP, in-process: one node (no services), its RPC server and its dashboard.

What is checked: the login URL from ``dashboard.login`` works once and sets an HttpOnly, SameSite=Strict
session cookie; no page, asset or API call works without that session; a wrong Host is refused even
with it; a POST needs the session's CSRF token and must not come from another site; a session can
only read; ``node.traffic`` samples the node.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest
from multiaddr import Multiaddr

from locomesh.node.daemon import register_node_methods
from locomesh.node.dashboard import Dashboard
from locomesh.node.dashboard.routes import MAX_API_BODY, PAGES
from locomesh.node.rpc.dispatch import METHOD_NOT_FOUND, RpcDispatcher
from locomesh.node.rpc.server import RpcServer
from locomesh.node.runtime import Node

COOKIE = "c" * 64


class Site:
    """A running node + server + dashboard, and an HTTP client for it."""

    def __init__(self, port: int, dashboard: Dashboard, rejected: list[str], client: httpx.AsyncClient) -> None:
        self.client = client
        self.port = port
        self.dashboard = dashboard
        self.rejected = rejected
        self.base = f"http://127.0.0.1:{port}"
        self.cookie_name = f"locomesh_session_{port}"

    async def request(self, method: str, path: str, *, cookies: dict | None = None, **options) -> httpx.Response:
        """One request that carries `cookies` and no other (the client keeps none between requests)."""
        self.client.cookies.clear()
        headers = dict(options.pop("headers", {}))
        if cookies:
            headers["Cookie"] = "; ".join(f"{name}={value}" for name, value in cookies.items())
        return await self.client.request(method, self.base + path, headers=headers, **options)

    async def rpc(self, method: str, params: dict | None = None) -> dict:
        """A call with the cookie-file secret, as the CLI makes it."""
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
        response = await self.request("POST", "/", json=body, headers={"Authorization": f"Bearer {COOKIE}"})
        return response.json()

    async def log_in(self) -> tuple[str, str]:
        """(session ID, CSRF token) of a fresh session."""
        url = (await self.rpc("dashboard.login"))["result"]["url"]
        response = await self.request("GET", url.removeprefix(self.base))
        session_id = response.cookies[self.cookie_name]
        page = await self.request("GET", "/", cookies={self.cookie_name: session_id})
        csrf = re.search(r'name="csrf-token" content="([^"]+)"', page.text).group(1)
        return session_id, csrf

    async def api(self, session_id: str | None, csrf: str | None, body: object, **headers: str) -> httpx.Response:
        sent = {"Content-Type": "application/json", **headers}
        if csrf is not None:
            sent["X-CSRF-Token"] = csrf
        cookies = {self.cookie_name: session_id} if session_id else None
        return await self.request("POST", "/api/rpc", content=json.dumps(body), headers=sent, cookies=cookies)


@pytest.fixture
async def site(nursery, identity_factory):
    node = Node.create(identity_factory(1), listen_addrs=[Multiaddr("/ip4/127.0.0.1/tcp/0")])
    register_node_methods(node)
    await nursery.start(node.run)
    rejected: list[str] = []
    dashboard = Dashboard(node, on_reject=rejected.append)
    server = RpcServer(RpcDispatcher(node.rpc), cookie=COOKIE, metrics=node.metrics, on_reject=rejected.append,
                       site=dashboard)
    port = await nursery.start(server.run)
    async with httpx.AsyncClient(timeout=10) as client:
        yield Site(port, dashboard, rejected, client)
    server.stop()
    node.request_stop()


async def test_the_login_url_works_once_and_sets_a_strict_http_only_cookie(site):
    login = (await site.rpc("dashboard.login"))["result"]
    assert login["url"].startswith(f"{site.base}/login?token=") and login["expires_in_s"] == 600
    path = login["url"].removeprefix(site.base)
    response = await site.request("GET", path)
    assert response.status_code == 200 and 'http-equiv="refresh" content="0; url=/"' in response.text
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{site.cookie_name}=") and "HttpOnly" in cookie and "Path=/" in cookie
    assert "samesite=strict" in cookie.lower()
    assert response.headers["referrer-policy"] == "no-referrer" and "frame-ancestors 'none'" in response.headers[
        "content-security-policy"]
    again = await site.request("GET", path)
    assert again.status_code == 403 and "set-cookie" not in again.headers
    assert (await site.request("GET", "/login?token=made-up")).status_code == 403
    assert (await site.request("GET", "/login")).status_code == 403


async def test_no_page_asset_or_call_works_without_the_session(site):
    for path in [page.replace("{run_id}", "abc") for page in PAGES] + ["/static/app.js", "/static/style.css"]:
        for cookies in (None, {site.cookie_name: "not-a-session"}):
            response = await site.request("GET", path, cookies=cookies)
            assert response.status_code == 401, path
            assert "locomesh ui" in response.text and "csrf-token" not in response.text
    call = {"jsonrpc": "2.0", "id": 1, "method": "node.status"}
    refused = await site.api(None, "whatever", call)
    assert refused.status_code == 401 and "peer_id" not in refused.text
    assert (await site.request("POST", "/logout")).status_code == 401
    assert "no-session" in site.rejected


async def test_a_session_opens_the_pages_and_their_assets(site):
    session_id, csrf = await site.log_in()
    cookies = {site.cookie_name: session_id}
    for path in [page.replace("{run_id}", "abc") for page in PAGES]:
        page = await site.request("GET", path, cookies=cookies)
        assert page.status_code == 200 and csrf in page.text and "/static/app.js" in page.text
    script = await site.request("GET", "/static/app.js", cookies=cookies)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert (await site.request("GET", "/static/secret.py", cookies=cookies)).status_code == 404
    assert (await site.request("GET", "/static/../app.py", cookies=cookies)).status_code == 404


async def test_a_wrong_host_is_refused_even_with_a_session(site):
    session_id, csrf = await site.log_in()
    cookies = {site.cookie_name: session_id}
    for host in (f"rebound.example:{site.port}", "127.0.0.1", f"127.0.0.1:{site.port + 1}", "localhost"):
        page = await site.request("GET", "/", cookies=cookies, headers={"Host": host})
        assert page.status_code == 403 and csrf not in page.text
        call = await site.api(session_id, csrf, {"jsonrpc": "2.0", "id": 1, "method": "node.status"}, Host=host)
        assert call.status_code == 403 and "peer_id" not in call.text
    for host in (f"localhost:{site.port}", f"[::1]:{site.port}"):
        assert (await site.request("GET", "/", cookies=cookies, headers={"Host": host})).status_code == 200
    assert "bad-host" in site.rejected


async def test_a_post_needs_the_csrf_token_and_our_own_origin(site):
    session_id, csrf = await site.log_in()
    call = {"jsonrpc": "2.0", "id": 1, "method": "node.status"}
    assert (await site.api(session_id, None, call)).status_code == 403
    assert (await site.api(session_id, csrf[:-1] + "x", call)).status_code == 403
    cross_site = await site.api(session_id, csrf, call, Origin="http://evil.example")
    assert cross_site.status_code == 403 and "peer_id" not in cross_site.text
    assert (await site.api(session_id, csrf, call, **{"Sec-Fetch-Site": "cross-site"})).status_code == 403
    same_site = await site.api(session_id, csrf, call, Origin=site.base, **{"Sec-Fetch-Site": "same-origin"})
    assert same_site.status_code == 200 and same_site.json()["result"]["peer_id"]
    # A form another site posts carries neither our token nor JSON; logging out needs the token too.
    form = await site.request("POST", "/logout", cookies={site.cookie_name: session_id},
                              headers={"Origin": "http://evil.example"}, data={"a": "b"})
    assert form.status_code == 403 and site.dashboard.sessions.get(session_id) is not None
    assert {"csrf", "cross-site"} <= set(site.rejected)
    logout = await site.request("POST", "/logout", cookies={site.cookie_name: session_id},
                                headers={"X-CSRF-Token": csrf})
    assert logout.status_code == 200 and site.dashboard.sessions.get(session_id) is None
    assert (await site.api(session_id, csrf, call)).status_code == 401


async def test_a_session_reads_through_the_nodes_own_rpc_and_only_reads(site):
    session_id, csrf = await site.log_in()
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "node.status"},
        {"jsonrpc": "2.0", "id": 2, "method": "node.traffic", "params": {"since": 0}},
        {"jsonrpc": "2.0", "id": 3, "method": "node.shutdown"},
        {"jsonrpc": "2.0", "id": 4, "method": "dashboard.login"},
    ]
    answers = {answer["id"]: answer for answer in (await site.api(session_id, csrf, batch)).json()}
    assert answers[1]["result"] == (await site.rpc("node.status"))["result"] | {"uptime_s": answers[1]["result"]["uptime_s"]}
    traffic = answers[2]["result"]
    assert traffic["columns"] == ["at", "bytes_in", "bytes_out", "peers"] and len(traffic["samples"]) >= 1
    assert len(traffic["now"]) == 4 and traffic["peers"] == {}
    assert answers[3]["error"]["code"] == METHOD_NOT_FOUND and answers[4]["error"]["code"] == METHOD_NOT_FOUND
    too_big = await site.api(session_id, csrf, {"jsonrpc": "2.0", "id": 1, "method": "x" * MAX_API_BODY})
    assert too_big.status_code == 413
