"""How the seat picker draws a 20,000-seat venue in headless Chromium: time from the waiting-room link to a
drawn map, and the intervals between animation frames while the fan zooms with the wheel and drags the map.
Run by `deploy/browser-test --bench` against the stack's demo event; it prints figures and asserts nothing
about time (the box is shared)."""

import sys
import time

from playwright.sync_api import sync_playwright

from conftest import queue_link


def main(event):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        start = time.monotonic()
        page.goto(queue_link(f"bench-{int(start)}", event))
        page.wait_for_url(f"**/events/{event}/buy", timeout=60_000)
        while not page.evaluate("!!(window.seatMap && window.seatMap.seatIds().length > 0)"):
            time.sleep(0.01)
        loaded = time.monotonic() - start
        seats = page.evaluate("window.seatMap.seatIds().length")
        box = page.locator("#map").bounding_box()
        cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        page.mouse.move(cx, cy)
        page.evaluate("""() => { window.frames_ = []; let last = performance.now();
          const tick = (t) => { window.frames_.push(t - last); last = t; requestAnimationFrame(tick); };
          requestAnimationFrame(tick); }""")
        for i in range(40):
            page.mouse.wheel(0, -60 if i < 20 else 60)
            page.wait_for_timeout(16)
        page.mouse.down()
        for i in range(60):
            page.mouse.move(cx + i * 5, cy + i * 2)
        page.mouse.up()
        page.wait_for_timeout(300)
        frames = sorted(page.evaluate("window.frames_"))
        browser.close()
    n = len(frames)
    print(f"{seats} seats: link to drawn map {loaded:.2f} s; {n} frames while zooming and dragging: "
          f"median {frames[n // 2]:.1f} ms, p95 {frames[int(n * 0.95)]:.1f} ms, max {frames[-1]:.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]))
