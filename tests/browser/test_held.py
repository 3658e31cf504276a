"""Every seat left held, in a real browser: the waiting page says how many seats may come back and when the
first hold ends, instead of an estimated wait, and admits the fan by itself once one comes back."""

import json
import subprocess
import time

from conftest import HELD, STACK, api, layout, queue_link


def room():
    return json.loads(subprocess.check_output([STACK, "admin", "get", str(HELD)], text=True))


def test_a_fan_told_what_may_come_back_is_admitted_when_a_hold_is_released(fans):
    seats = sorted(layout(HELD))
    assert len(seats) == 10, seats
    # Two other fans hold every seat between them (as apps would, with their own admission proofs).
    holds = []
    for account, basket in (("held-a", seats[:5]), ("held-b", seats[5:])):
        status, body = api("POST", f"/events/{HELD}/holds", account, {"seat_ids": basket}, event=HELD)
        assert status == 201, body
        holds.append((account, body))
    deadline = time.monotonic() + 10
    while not room().get("all_held"):
        assert time.monotonic() < deadline, room()
        time.sleep(0.2)
    assert room()["seats_may_return"] == 10, room()

    fan = fans("held-waiting")
    fan.page.goto(queue_link("held-waiting", HELD))
    fan.page.wait_for_selector("#position", timeout=15_000)
    deadline = time.monotonic() + 15
    while "10 seats may still come back" not in fan.page.inner_text("body"):
        assert time.monotonic() < deadline, fan.page.inner_text("body")
        time.sleep(0.1)
    text = fan.page.inner_text("body")
    assert "Every seat left is held or awaiting payment" in text, text
    # The holds last minutes: the page names the time the first one ends, and gives no estimated wait.
    assert "The first could come back at" in text, text
    assert "Estimated wait" not in text, text
    assert not fan.page.is_visible("#code-form"), "a public room offers no presale code"
    fan.shot("queue-all-held")

    # One hold is released: its seats come back and the waiting fan is admitted without doing anything.
    account, hold = holds[0]
    status, _ = api("DELETE", f"/events/{HELD}/holds/{hold['hold_token']}", account, event=HELD)
    assert status in (200, 204), status
    fan.page.wait_for_url(f"**/events/{HELD}/buy", timeout=30_000)
