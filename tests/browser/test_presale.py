"""Presale codes in a real browser: in a room whose code holders go first, a fan who joined without a code is
offered the code form, types a code, and is admitted and reaches the seats ahead of a fan who joined before it
without one."""

import json
import subprocess
import time
import urllib.request

from conftest import GATEWAY, PRESALE, STACK, queue_link, token


def call(method, path, bearer, headers=None):
    req = urllib.request.Request(f"{GATEWAY}{path}", method=method)
    req.add_header("Authorization", f"Bearer {bearer}")
    req.add_header("Accept", "application/json")
    for name, value in (headers or {}).items():
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def admin(*args):
    return json.loads(subprocess.check_output([STACK, "admin", *args], text=True))


def test_a_presale_code_typed_into_the_page_admits_its_fan_ahead_of_the_public(fans):
    # A fan without a code joins first (through the API, as an app would): it waits behind the code holders.
    status, early = call("POST", f"/queue/{PRESALE}/join", token("account", "presale-public"))
    assert status == 200 and early["position"] == 1 and early.get("behind_code_holders"), early
    code = admin("codes", str(PRESALE), "--count", "1")["codes"][0]

    fan = fans("presale-holder")
    fan.page.goto(queue_link("presale-holder", PRESALE))
    fan.page.wait_for_selector("#code-form:not([hidden])", timeout=15_000)
    assert "go first" in fan.page.inner_text("#code-label")
    assert fan.page.inner_text("#position") == "2"
    # A wrong code is refused on the page, and the fan keeps its place.
    fan.page.fill("#code-input", "WRONG-CODE-1")
    fan.page.click("#code-form button")
    fan.page.wait_for_selector("#code-error.error", timeout=10_000)
    assert "not one of this sale" in fan.page.inner_text("#code-error")
    fan.shot("presale-code-form")
    # The real one, typed in lower case: the fan is now ahead of the one who came first.
    fan.page.fill("#code-input", code.lower())
    fan.page.click("#code-form button")
    fan.page.wait_for_selector("#code-form", state="hidden", timeout=10_000)
    deadline = time.monotonic() + 10
    while fan.page.inner_text("#position") != "1":
        assert time.monotonic() < deadline, fan.page.inner_text("#position")
        time.sleep(0.1)

    # The room opens with room for one: the code holder goes in and reaches the seats; the other still waits.
    admin("set", str(PRESALE), "--state", "open")
    fan.page.wait_for_url(f"**/events/{PRESALE}/buy", timeout=30_000)
    status, later = call("GET", f"/queue/{PRESALE}/status", early["ticket"])
    assert status == 200 and later["state"] == "waiting" and later["position"] == 1, later
    report = admin("codes", str(PRESALE), "--list")
    assert report["redeemed_total"] == 1, report
    assert [r["account"] for r in report["redemptions"]] == ["presale-holder"], report
