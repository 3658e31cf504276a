"""A fan's journey through the pages in headless Chromium: waiting room, seat map, hold, checkout, payment at the
provider and the paid order; a second fan's map that follows it live; a seat taken under a fan's hand; best
available; and a phone's screen."""

import re
import time

from conftest import QUEUE, SALE, api, layout, queue_link


def wait_for(check, within, what):
    """Polls `check` until it is true, for at most `within` seconds; returns how long it took."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > within:
            raise AssertionError(f"{what}: not within {within} s")
        time.sleep(0.02)
    return time.monotonic() - start


def tab_to(page, element_id, presses=30):
    """Presses Tab (at most `presses` times) until the element with this id has the focus."""
    for _ in range(presses):
        if page.evaluate("document.activeElement && document.activeElement.id") == element_id:
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"#{element_id} is not reached with Tab")


def test_the_waiting_room_shows_a_fan_the_pre_queue(fans):
    fan = fans("queue-fan")
    fan.page.goto(queue_link("queue-fan", QUEUE))
    fan.page.wait_for_selector("text=The sale has not opened yet", timeout=15_000)
    assert "Opens at" in fan.page.inner_text("#eta")
    fan.shot("journey-1-waiting-room")


def test_a_fan_buys_with_the_keyboard_alone_while_another_sees_the_seats_go(fans):
    buyer = fans("buyer")
    watcher = fans("watcher")
    buyer.open_sale()
    watcher.open_sale()
    watcher.page.evaluate("window.notReloaded = true")
    buyer.shot("journey-2-seat-map")

    # Keyboard only: focus the map, walk to seats with the arrow keys, pick two with Enter and Space.
    buyer.page.focus("#map")
    buyer.page.keyboard.press("ArrowRight")
    buyer.page.keyboard.press("Enter")
    first = buyer.page.inner_text("#seat-focus")
    assert re.search(r"Row \w+ Seat \d+, \d+\.\d\d EUR, available, selected", first), first
    buyer.page.keyboard.press("ArrowRight")
    buyer.page.keyboard.press(" ")
    assert buyer.page.locator("#selection li").count() == 2
    buyer.shot("journey-3-seats-picked")

    # From the map, Tab reaches the hold button (past each picked seat's Remove button).
    tab_to(buyer.page, "hold")
    buyer.page.keyboard.press("Enter")
    buyer.page.wait_for_selector("#hold-panel:not([hidden])")
    assert re.search(r"\d+:\d\d left to check out", buyer.page.inner_text("#hold-timer"))
    held = [int(x) for x in buyer.page.evaluate(
        "[...window.seatMap.seatIds()].filter((s) => window.seatMap.statusOf(s) === 'held')")]
    tab_to(buyer.page, "extend")
    buyer.page.keyboard.press("Enter")
    buyer.page.wait_for_selector("text=You have more time.")
    buyer.shot("journey-4-held")

    tab_to(buyer.page, "checkout")
    buyer.page.keyboard.press("Enter")
    buyer.page.wait_for_selector("#order-panel:not([hidden])")
    assert "Reserved for you until" in buyer.page.inner_text("#order-status")
    # The watcher's map turns the buyer's seats sold within a second, without reloading.
    mine = [s for s in held if watcher.status_of(s) != "available"]
    assert len(mine) >= 2, held
    took = wait_for(lambda: all(watcher.status_of(s) == "sold" for s in mine), 1.0, "the watcher sees the seats sold")
    assert watcher.page.evaluate("window.notReloaded === true")
    print(f"the watcher saw the sale after {took * 1000:.0f} ms")
    buyer.shot("journey-5-order")

    tab_to(buyer.page, "pay")
    buyer.page.keyboard.press("Enter")
    buyer.page.wait_for_selector("text=Fake Payments", timeout=10_000)
    buyer.shot("journey-6-payment")
    tab_to(buyer.page, "pay")  # the provider's own Pay button
    buyer.page.keyboard.press("Enter")
    buyer.page.wait_for_url(f"**/events/{SALE}/buy#order=*", timeout=10_000)
    buyer.page.wait_for_selector("#order-status.paid", timeout=15_000)
    assert "Paid" in buyer.page.inner_text("#order-status")
    buyer.shot("journey-7-paid")


def test_a_seat_taken_under_a_fans_hand_is_named_and_nearby_seats_are_offered(fans):
    fan = fans("third-fan")
    fan.open_sale()
    seats = layout()
    # Two side-by-side free seats in a middle row of the second section, picked with the pointer.
    row = sorted((n, s) for s, (_, sec, r, n) in seats.items() if sec == 1 and r == "J")
    pair = [row[10][1], row[11][1]]
    for s in pair:
        fan.click_seat(s)
    assert fan.page.locator("#selection li").count() == 2

    # Another fan holds one of them: the map greys it, the page names it and offers nearby blocks of two.
    status, body = api("POST", f"/events/{SALE}/holds", "rival", {"seat_ids": [pair[0]]})
    assert status == 201, body
    wait_for(lambda: fan.status_of(pair[0]) == "held", 1.0, "the seat turns grey")
    message = fan.page.inner_text("#message")
    assert f"{seats[pair[0]][0]} was just taken" in message, message
    assert fan.page.locator("#selection li").count() == 1
    offers = fan.page.locator("#alternative-list li")
    assert offers.count() == 3
    fan.shot("journey-8-seat-taken")

    # Clicking a seat already taken says the same, for a basket of one more.
    fan.click_seat(pair[0])
    assert f"{seats[pair[0]][0]} was just taken" in fan.page.inner_text("#message")

    # The fan takes the first block offered.
    offered = [int(s) for s in fan.page.get_attribute("#alternative-list li >> nth=0", "data-seats").split(",")]
    assert len(offered) == 2 and pair[0] not in offered, offered
    fan.page.click("#alternative-list li >> nth=0 >> button")
    fan.page.wait_for_selector("#hold-panel:not([hidden])")
    held = fan.page.inner_text("#hold-seats")
    for s in offered:
        assert seats[s][0] in held, (seats[s][0], held)


def test_best_available_from_the_page(fans):
    fan = fans("best-fan")
    fan.open_sale()
    fan.page.select_option("#best-quantity", "3")
    fan.page.click("#best-go")
    fan.page.wait_for_selector("#hold-panel:not([hidden])")
    names = fan.page.locator("#hold-seats li").all_inner_texts()
    assert len(names) == 3, names
    rows = {re.search(r"(Block \d+ Row \w+) Seat", n).group(1) for n in names}
    numbers = sorted(int(re.search(r"Seat (\d+)", n).group(1)) for n in names)
    assert len(rows) == 1 and numbers == list(range(numbers[0], numbers[0] + 3)), names
    fan.shot("journey-9-best-available")


def test_the_picker_fits_a_phone(fans):
    fan = fans("phone-fan", viewport={"width": 390, "height": 844})
    fan.open_sale()
    width = fan.page.evaluate("document.scrollingElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways: {width} px"
    fan.page.locator("#best-go").scroll_into_view_if_needed()
    fan.page.evaluate("window.scrollTo(0, 0)")
    fan.shot("phone-1-seat-map")
    # Every control can be reached and has a name.
    for sel in ["#zoom-in", "#zoom-out", "#zoom-fit", "#best-quantity", "#best-go"]:
        assert fan.page.locator(sel).is_visible(), sel
    assert fan.page.get_attribute("#map", "aria-label")
