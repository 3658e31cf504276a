"""Shared pieces of the browser tests: the stack's addresses, tokens made by `deploy/stack token`, headless
Chromium from Debian, and calls to the API as another fan would make them."""

import json
import os
import subprocess
import time
import urllib.request

import pytest
from playwright.sync_api import sync_playwright

GATEWAY = os.environ.get("GATEWAY_URL", "http://127.0.0.1:18000")
SALE = int(os.environ.get("SALE_EVENT", "0"))
QUEUE = int(os.environ.get("QUEUE_EVENT", "0"))
GATED = int(os.environ.get("GATED_EVENT", "0"))
PRESALE = int(os.environ.get("PRESALE_EVENT", "0"))
HELD = int(os.environ.get("HELD_EVENT", "0"))
SHOTS = os.environ.get("SHOTS", "target/browser")
STACK = os.environ.get("STACK", "deploy/stack")


def token(kind, account, event=None):
    args = [STACK, "token", kind, "--account", account]
    if event is not None:
        args += ["--event", str(event)]
    return subprocess.check_output(args, text=True).strip()


def queue_link(account, event=SALE):
    """The link `deploy/stack url` makes: a one-time sign-in code the gateway exchanges for the account's
    cookie, then the waiting room."""
    return subprocess.check_output([STACK, "url", "--account", account, "--event", str(event)], text=True).strip()


def api(method, path, account, body=None, event=SALE):
    """A call through the gateway with an admission proof, as a fan's app would make it."""
    req = urllib.request.Request(f"{GATEWAY}{path}", method=method)
    req.add_header("Authorization", f"Bearer {token('admission', account, event)}")
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, data, timeout=10) as res:
            return res.status, json.loads(res.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def layout(event=SALE):
    """The event's layout (public), as seat id -> (label, section index, row, number)."""
    with urllib.request.urlopen(f"{GATEWAY}/events/{event}/seats/status", timeout=10) as res:
        status = json.loads(res.read())
    with urllib.request.urlopen(f"{GATEWAY}{status['layout']}", timeout=10) as res:
        seats = json.loads(res.read())["seats"]
    return {
        sid: (seats["label"][i], seats["section"][i], seats["row"][i], seats["number"][i])
        for i, sid in enumerate(seats["seat_id"])
    }


@pytest.fixture(scope="session")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        yield b
        b.close()


class Fan:
    """One fan's browser: a context of its own (its own cookies), and the page's errors collected."""

    def __init__(self, browser, name, viewport=None):
        self.name = name
        self.context = browser.new_context(viewport=viewport or {"width": 1280, "height": 860})
        self.page = self.context.new_page()
        self.errors = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        # A script or style the page's Content-Security-Policy blocked is reported on the console only.
        self.page.on(
            "console",
            lambda m: self.errors.append(m.text) if "Content Security Policy" in m.text else None,
        )

    def shot(self, name):
        os.makedirs(SHOTS, exist_ok=True)
        self.page.screenshot(path=os.path.join(SHOTS, f"{name}.png"))

    def open_sale(self, event=SALE):
        """From the waiting room to the seat picker, as a fan who follows a link."""
        self.page.goto(queue_link(self.name, event))
        self.page.wait_for_url(f"**/events/{event}/buy", timeout=30_000)
        # Polled from here: the page's Content-Security-Policy forbids the eval that wait_for_function needs.
        deadline = time.monotonic() + 30
        while not self.page.evaluate("!!(window.seatMap && window.seatMap.seatIds().length > 0)"):
            assert time.monotonic() < deadline, "the seat map did not load within 30 s"
            time.sleep(0.05)
        self.page.wait_for_selector("#live.on", timeout=10_000)

    def status_of(self, seat):
        return self.page.evaluate("(s) => window.seatMap.statusOf(s)", seat)

    def click_seat(self, seat):
        """Shows the seat on the map (zoomed in) and clicks it where it is drawn."""
        self.page.evaluate("(s) => window.seatMap.show(s)", seat)
        self.page.wait_for_timeout(100)
        p = self.page.evaluate("(s) => window.seatMap.screenPoint(s)", seat)
        self.page.mouse.click(p["x"], p["y"])

    def close(self):
        assert not self.errors, f"{self.name}'s page threw: {self.errors}"
        self.context.close()


@pytest.fixture
def fans(browser):
    made = []

    def make(name, **kw):
        fan = Fan(browser, name, **kw)
        made.append(fan)
        return fan

    yield make
    for fan in made:
        fan.close()
