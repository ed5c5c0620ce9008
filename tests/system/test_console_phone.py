"""The console on a phone (issue 48 item 4), in a real browser at 390 px: the
dashboard of seven queues and a queue page of 25 rows stay short, the bulk
actions come before the rows, and the trend charts' text is readable."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

from daemon_util import send, settle
from test_console_browser import _browser, _need_browser
from web_support import web_server  # noqa: F401

PHONE = {"width": 390, "height": 844}
QUEUES = ("etl", "billing", "mail", "images", "relay", "cleaner", "webhook")


def test_a_phone_sees_the_queues_and_the_rows_without_scrolling_for_ever(
        make_queue, daemon, web_server, tmp_path):
    sync_playwright, _axe = _need_browser()
    procs = {}
    for name in QUEUES:
        make_queue(name, "echo done >&3")
        procs[name] = daemon(name)
    for msg_id in [send(procs["etl"], param1=str(n)) for n in range(25)]:
        settle(procs["etl"], msg_id)
    server = web_server()
    with sync_playwright() as pw:
        browser = _browser(pw, tmp_path, viewport=PHONE)
        try:
            page = browser.new_page()
            page.goto(server.base + "/", timeout=15000)
            # each queue a card of two cells a line: 4,340 px for these seven before
            assert page.evaluate("document.documentElement.scrollHeight") <= 3200
            assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
            page.goto(server.base + "/q/etl?state=done", timeout=15000)
            # 25 rows: 7,704 px before, with the bulk actions below them all
            assert page.evaluate("document.documentElement.scrollHeight") <= 5800
            assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
            bulk = page.locator("#bulk").bounding_box()
            rows = page.locator("#live-queue table").bounding_box()
            assert bulk is not None and rows is not None and bulk["y"] < rows["y"]
            page.goto(server.base + "/q/etl/trends", timeout=15000)
            # the charts' axis text: 5 px high before (a 720-wide drawing at 374 px)
            heights = page.evaluate("""() => Array.from(document.querySelectorAll(
                'svg.chart text')).map(t => t.getBoundingClientRect().height)""")
            assert heights and min(heights) >= 9, heights
        finally:
            browser.close()
