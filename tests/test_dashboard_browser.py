"""The dashboard in a real browser: headless Chromium driven by Selenium, against daemons on loopback.

The browser and its driver are the distribution's (`apt-get install chromium chromium-driver`, as
.ci/run does); Selenium is told where the driver is, so it downloads nothing. Without them these
tests skip, except under CI (``CI`` set), where they fail: there they must run.

- quick: one daemon; ``locomesh ui --open`` hands the one-time login URL to "the browser" ($BROWSER);
  Chromium logs in with it and the node page fills in; the same pages then refuse a browser without
  the session, a DNS-rebound host name, and a cross-site POST from another origin's page;
- slow: two daemons train a run together; the run's loss chart and members, the peers table (direct,
  with a round trip), the timeline and the downloads page fill in; a screenshot of each page.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from locomesh.cli.daemon_process import DaemonProcess
from locomesh.cli.swarm_cmd import create_run, join_all, start_swarm, stop_swarm, wait_connected

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists() else None)
UNDER_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
REBOUND = "rebound.test"  # a DNS name the browser resolves to 127.0.0.1: a DNS-rebinding attack's view
PAGE_TIMEOUT = 30.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None or CHROMEDRIVER is None:
        message = "chromium and chromedriver are needed: apt-get install chromium chromium-driver"
        if UNDER_CI:
            pytest.fail(f"{message} (.ci/run installs them; under CI these tests must run)")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1100", f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1",
                     f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(PAGE_TIMEOUT)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def other_site():
    """A page at another origin (127.0.0.1, another port) whose form posts to the URL in its query."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            target = self.path.partition("?to=")[2]
            body = (f'<form method="post" action="{target}"><input type="hidden" name="a" value="b"></form>'
                    "<script>document.forms[0].submit()</script>").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def login_url(data_dir: Path, tmp_path: Path) -> str:
    """The URL `locomesh ui --open` hands to the web browser (a $BROWSER script that writes it down)."""
    opened = tmp_path / "opened-url"
    script = tmp_path / "browser.sh"
    script.write_text(f'#!/bin/sh\nprintf %s "$1" > {opened}\n')
    script.chmod(0o755)
    env = {**os.environ, "BROWSER": f"{script} %s"}
    result = subprocess.run([sys.executable, "-m", "locomesh.cli.main", "ui", "--open", "--data-dir", str(data_dir)],
                            capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 0, result.stderr
    url = opened.read_text()
    assert url.startswith("http://127.0.0.1:") and "/login?token=" in url and url in result.stdout
    return url


def wait_for(driver, condition: Callable, what: str, timeout: float = PAGE_TIMEOUT):
    """`condition(driver)` once truthy (its value), polled; an element the page replaced meanwhile
    (a poll redraws it) only means "not yet"."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,))
    return wait.until(condition, message=f"waiting for {what}")


def rows(driver, table_id: str) -> list[str]:
    """The text of each row of the table's body (but the "none" row), read in one go."""
    script = "return Array.from(document.querySelectorAll(arguments[0]), (row) => row.innerText);"
    return [text for text in driver.execute_script(script, f"#{table_id} tbody tr") if text.strip() != "none"]


def points(driver, chart_id: str, name: str) -> int:
    """How many points the chart's line named `name` has (0 if none is drawn), read in one go."""
    script = ("const line = document.querySelector(arguments[0]);"
              "const points = line ? (line.getAttribute('points') || '').trim() : '';"
              "return points ? points.split(/\\s+/).length : 0;")
    return driver.execute_script(script, f'#{chart_id} polyline[data-name="{name}"]')


def screenshot(driver, path: Path) -> None:
    assert driver.save_screenshot(str(path))
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


def test_a_browser_logs_in_once_and_the_pages_refuse_everyone_else(browser, other_site, tmp_path):
    daemon = DaemonProcess(tmp_path / "node").start()
    try:
        status = daemon.wait_ready()
        base = f"http://127.0.0.1:{daemon.rpc().port}"
        url = login_url(daemon.data_dir, tmp_path)
        browser.get(url)
        wait_for(browser, lambda d: d.current_url == f"{base}/", "the login page to open the dashboard")
        wait_for(browser, lambda d: status["peer_id"] in d.find_element("id", "node-facts").text, "the node page")
        wait_for(browser, lambda d: points(d, "traffic-chart", "received") >= 1, "the traffic chart")
        screenshot(browser, tmp_path / "node.png")

        browser.get(url)  # the same URL again: used up
        assert "Login link used or expired" in browser.page_source
        browser.get(f"http://{REBOUND}:{daemon.rpc().port}/")  # a rebound DNS name: refused, cookie or not
        assert "HTTP 403" in browser.page_source and "Host header" in browser.page_source
        browser.get(f"{other_site}/?to={base}/logout")  # another origin's page posts to us
        wait_for(browser, lambda d: d.current_url == f"{base}/logout", "the cross-site form to be sent")
        assert "HTTP 403" in browser.page_source and "another site" in browser.page_source
        browser.get(f"{base}/peers")  # still logged in: the cross-site POST did nothing
        wait_for(browser, lambda d: d.find_elements("id", "peers-table"), "the peers page")

        browser.delete_all_cookies()
        for path in ("/", "/peers", "/runs", "/downloads", "/static/app.js"):
            browser.get(base + path)
            assert "Not logged in" in browser.page_source and "csrf-token" not in browser.page_source
    finally:
        daemon.stop()


@pytest.mark.slow
def test_two_daemons_fill_the_run_and_peers_pages(browser, tmp_path):
    daemons = start_swarm(tmp_path, 2)
    try:
        wait_connected(daemons)
        run_id = create_run(daemons[0], {"inner_steps": 4, "round_deadline_s": 60, "min_peers": 2}, admitted=daemons)
        join_all(daemons, run_id)
        base = f"http://127.0.0.1:{daemons[0].rpc().port}"
        browser.get(login_url(daemons[0].data_dir, tmp_path))
        wait_for(browser, lambda d: d.current_url == f"{base}/", "the login page to open the dashboard")

        browser.get(f"{base}/runs/{run_id}")
        wait_for(browser, lambda d: points(d, "loss-chart", "eval loss") >= 3, "two rounds on the loss chart")
        wait_for(browser, lambda d: points(d, "loss-chart", "entropy floor") == 2, "the entropy floor")
        members = wait_for(browser, lambda d: len(rows(d, "members-table")) == 2 and rows(d, "members-table"),
                           "both members")
        assert any("this node" in row for row in members)
        assert all("votes" in row for row in members), "both were admitted: each has a say"
        facts = browser.find_element("id", "run-facts").text
        assert "yes: votes on the rounds" in facts and "Stuck\nno" in facts, facts
        assert rows(browser, "contributions-table") and rows(browser, "rounds-table")
        timeline = browser.find_elements("css selector", "#timeline-chart rect")
        assert timeline, "the round timeline has bars"
        screenshot(browser, tmp_path / "run.png")

        other = daemons[1].rpc().call("node.status")["peer_id"]
        browser.get(f"{base}/peers")
        peer_rows = wait_for(browser, lambda d: [row for row in rows(d, "peers-table") if " ms" in row],
                             "the peer's round trip")
        assert len(peer_rows) == 1 and "direct" in peer_rows[0] and other[-6:] in peer_rows[0]
        screenshot(browser, tmp_path / "peers.png")

        browser.get(f"{base}/downloads")
        wait_for(browser, lambda d: d.find_elements("id", "downloads-table"), "the downloads page")
        screenshot(browser, tmp_path / "downloads.png")
    finally:
        stop_swarm(daemons)
