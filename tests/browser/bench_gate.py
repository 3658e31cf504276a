"""How long the waiting-room page's proof-of-work worker takes to solve the gate's challenges in headless
Chromium, with the CPU unthrottled and throttled four times (a mid-range phone, as DevTools models one): the
page's own worker (`/queue/{id}/solver.js`) solving challenges the stack's gateway issues for a room whose
challenge is on, at the room's difficulty. Run by `deploy/browser-test --bench`; it prints figures and asserts
nothing about time (the box is shared)."""

import json
import statistics
import sys
import time
import urllib.request

from playwright.sync_api import sync_playwright

from conftest import GATEWAY, token

SOLVES = 15


def challenge(event, account):
    """A join without a solution: the 428's challenge and difficulty."""
    req = urllib.request.Request(f"{GATEWAY}/queue/{event}/join", method="POST")
    req.add_header("Authorization", f"Bearer {token('account', account)}")
    try:
        urllib.request.urlopen(req, timeout=10)
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        if e.code == 428:
            return {"challenge": body["challenge"], "difficulty": body["difficulty"]}
        raise AssertionError(f"{e.code}: {body}") from e
    raise AssertionError("the room gave a place without a challenge: is its challenge on?")


SOLVE = """async (ask) => {
  const worker = new Worker(`/queue/${ask.event}/solver.js`);
  const started = performance.now();
  const payload = await new Promise((resolve, reject) => {
    worker.onmessage = ({ data }) => { if (data.progress === undefined) resolve(data.payload); };
    worker.onerror = reject;
    worker.postMessage(ask.body);
  });
  worker.terminate();
  const solution = JSON.parse(atob(payload)).solution;
  return { ms: performance.now() - started, counter: solution.counter };
}"""


# The same solver run on the page's main thread, where DevTools' CPU throttling applies (it does not reach
# workers): the script's `self` is a stand-in that takes its messages.
SOLVE_ON_MAIN = """async (ask) => {
  const started = performance.now();
  const payload = await new Promise((resolve) => {
    const scope = { postMessage: (m) => { if (m.progress === undefined) resolve(m.payload); } };
    new Function('self', ask.source)(scope);
    scope.onmessage({ data: ask.body });
  });
  const solution = JSON.parse(atob(payload)).solution;
  return { ms: performance.now() - started, counter: solution.counter };
}"""


def report(what, runs, difficulty):
    ms = sorted(r["ms"] for r in runs)
    per_hash_us = 1000 * sum(ms) / sum(r["counter"] + 1 for r in runs)
    print(f"{what}: {len(ms)} solves at difficulty {difficulty}: median {statistics.median(ms):.0f} ms, "
          f"max {ms[-1]:.0f} ms; {per_hash_us:.2f} µs per hash")


def main(event):
    stamp = int(time.time())
    asks = [challenge(event, f"gate-bench-{stamp}-{i}") for i in range(4 * SOLVES)]
    difficulty = asks[0]["difficulty"]
    with urllib.request.urlopen(f"{GATEWAY}/queue/{event}/solver.js", timeout=10) as res:
        source = res.read().decode()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page()
        # A blank page of the gateway's origin, without the waiting room's policy: the worker's script must be
        # same-origin, and the main-thread run compiles the solver's source.
        page.route(f"{GATEWAY}/gate-bench", lambda route: route.fulfill(body="<!doctype html>", content_type="text/html"))
        page.goto(f"{GATEWAY}/gate-bench")
        cdp = page.context.new_cdp_session(page)
        batches = [asks[i * SOLVES:(i + 1) * SOLVES] for i in range(4)]
        for rate, (in_worker, on_main) in ((1, batches[:2]), (4, batches[2:])):
            cdp.send("Emulation.setCPUThrottlingRate", {"rate": rate})
            runs = [page.evaluate(SOLVE, {"event": event, "body": ask}) for ask in in_worker]
            report(f"CPU throttled {rate}x, in the page's worker", runs, difficulty)
            runs = [page.evaluate(SOLVE_ON_MAIN, {"source": source, "body": ask}) for ask in on_main]
            report(f"CPU throttled {rate}x, on the main thread", runs, difficulty)
        browser.close()


if __name__ == "__main__":
    main(int(sys.argv[1]))
