"""The gate in a real browser: in a waiting room whose challenge is on, a fan's page solves the proof of work in
its worker, shows its progress, joins, is admitted, buys and says it is done; the solution it sent cannot be
sent again."""

import json
import urllib.request

from conftest import GATED, GATEWAY, token


def join(account, event, altcha=None):
    """`POST /queue/{event}/join` as a fan's app would send it, with the account token."""
    req = urllib.request.Request(f"{GATEWAY}/queue/{event}/join", method="POST")
    req.add_header("Authorization", f"Bearer {token('account', account)}")
    req.add_header("Accept", "application/json")
    if altcha is not None:
        req.add_header("altcha", altcha)
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_a_fan_solves_the_rooms_challenge_joins_buys_and_its_solution_cannot_be_replayed(fans):
    fan = fans("gated-fan")
    solutions = []
    fan.page.on(
        "request",
        lambda r: solutions.append(r.headers["altcha"]) if r.url.endswith("/join") and "altcha" in r.headers else None,
    )
    fan.open_sale(GATED)
    assert len(solutions) == 1, f"the page sent {len(solutions)} solutions"

    fan.page.select_option("#best-quantity", "2")
    fan.page.click("#best-go")
    fan.page.wait_for_selector("#hold-panel:not([hidden])")
    fan.page.click("#checkout")
    fan.page.wait_for_selector("#order-panel:not([hidden])")
    fan.page.click("#pay")
    fan.page.wait_for_selector("text=Fake Payments", timeout=10_000)
    fan.page.click("#pay")
    fan.page.wait_for_url(f"**/events/{GATED}/buy#order=*", timeout=10_000)
    fan.page.wait_for_selector("#order-status.paid", timeout=15_000)
    # Done: the fan leaves the room from the page, and its slot goes to the next fan.
    fan.page.click("#done")
    fan.page.wait_for_selector("#message.info", timeout=10_000)
    assert "next fan" in fan.page.inner_text("#message")

    # The page's solution, sent again by anyone (the fan's own account included), is spent.
    status, body = join("gated-fan", GATED, solutions[0])
    assert (status, body.get("error")) == (409, "challenge_spent"), body
    status, body = join("gated-thief", GATED, solutions[0])
    assert (status, body.get("error")) == (403, "challenge_not_yours"), body
    # Without a solution, a new account is asked for one.
    status, body = join("gated-newcomer", GATED)
    assert (status, body.get("error")) == (428, "challenge_required"), body
    assert body["challenge"]["parameters"]["algorithm"] == "SHA-256" and body["difficulty"] > 0, body
