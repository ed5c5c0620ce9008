"""The console from the keyboard and at the operator's pace (issue 48 items 3
and 7), in a real browser on a root with several queues, the built-in ones
among them: the shortcuts (``/``, ``?``, ``g d``, ``r``, ``t``), the focus
back on the control that acted after a page is shown again, the live parts
at the rate the operator picks (off included) and paused while the tab is
hidden, and shift-click ranges of chosen rows."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import sys
import time

from daemon_util import send, settle
from test_console_browser import FAILING, _browser, _need_browser
from web_support import web_server  # noqa: F401

QUEUES = ("etl", "billing", "relay", "cleaner", "webhook")
WIDE = {"width": 1400, "height": 900}


def _queues(make_queue, daemon, tmp_path):
    procs = {}
    for name in QUEUES:
        if name == "etl":
            make_queue(name, FAILING, shebang=f"#!{sys.executable}",
                       env_vars={"GO_FILE": str(tmp_path / "go")})
        else:
            make_queue(name, "echo done >&3")
        procs[name] = daemon(name)
    return procs


def _focused(page) -> str:
    return page.evaluate("document.activeElement.getAttribute('aria-label') || "
                         "document.activeElement.tagName")


def test_the_shortcuts_and_the_focus_after_an_action(make_queue, daemon, web_server, tmp_path):
    sync_playwright, _axe = _need_browser()
    procs = _queues(make_queue, daemon, tmp_path)
    server = web_server()
    with sync_playwright() as pw:
        browser = _browser(pw, tmp_path, viewport=WIDE)
        try:
            page = browser.new_page()
            page.goto(server.base + "/", timeout=15000)
            # ? lists the shortcuts in a dialog; Escape closes it
            page.keyboard.press("?")
            assert page.locator("#keys").evaluate("d => d.open")
            assert "the dashboard" in page.locator("#keys").inner_text()
            page.keyboard.press("Escape")
            assert not page.locator("#keys").evaluate("d => d.open")
            # / goes to the search box, and a key typed there is the search's, not a shortcut
            page.keyboard.press("/")
            assert _focused(page) == "search all queues"
            page.keyboard.type("t")
            assert page.locator("form.find input").input_value() == "t"
            assert page.evaluate("document.documentElement.dataset.theme || ''") == ""
            # t switches the theme (outside a field)
            page.locator("h1").click()
            page.keyboard.press("t")
            theme = page.evaluate("document.documentElement.dataset.theme")
            assert theme in ("light", "dark")
            page.keyboard.press("t")
            assert page.evaluate("document.documentElement.dataset.theme") != theme
            # r refreshes the live parts now, whatever the rate
            before = page.evaluate("document.getElementById('live-dashboard').dataset."
                                   "refreshed || ''")
            page.keyboard.press("r")
            page.wait_for_function(
                "(b) => (document.getElementById('live-dashboard').dataset.refreshed || '')"
                " !== b", arg=before, timeout=3000)
            # g then d: the dashboard, from any page
            page.goto(server.base + "/q/billing", timeout=15000)
            page.locator("h1").click()
            page.keyboard.press("g")
            page.keyboard.press("d")
            page.wait_for_url(server.base + "/", timeout=5000)
            # an action from the keyboard: the focus is back on that queue's controls
            # (it went to the top of the page)
            page.get_by_role("button", name="pause queue billing").focus()
            page.keyboard.press("Enter")
            page.get_by_role("button", name="resume queue billing").wait_for(timeout=10000)
            assert _focused(page) == "resume queue billing"
            assert procs["billing"].call("counts")["admin"] == "PAUSE"
            page.keyboard.press("Enter")  # and back, from where the focus is
            page.get_by_role("button", name="pause queue billing").wait_for(timeout=10000)
            assert _focused(page) == "pause queue billing"
            assert procs["billing"].call("counts")["admin"] == "UP"
        finally:
            browser.close()


def test_the_live_rate_is_the_operators_pushed_and_waits_while_hidden(
        make_queue, daemon, web_server, tmp_path):
    # the live parts: a stream a tab at the rate picked, the page fetched when it
    # changed; off, nothing; hidden, nothing; without EventSource, polled at the rate
    sync_playwright, _axe = _need_browser()
    procs = _queues(make_queue, daemon, tmp_path)
    billing = procs["billing"]
    server = web_server()
    with sync_playwright() as pw:
        browser = _browser(pw, tmp_path, viewport=WIDE)
        try:
            page = browser.new_page()
            fetched: list[float] = []
            streams: list[str] = []
            page.on("request", lambda req: fetched.append(time.monotonic())
                    if req.url == server.base + "/" and req.resource_type == "fetch"
                    else streams.append(req.url) if "/live?" in req.url else None)
            page.goto(server.base + "/", timeout=15000)
            picker = page.get_by_label("refresh live parts every")
            assert picker.input_value() == "5"  # the page's own until one is picked
            page.wait_for_timeout(500)
            assert streams and streams[-1].endswith("every=5")

            def fetches_in(seconds: float, busy: bool = False) -> int:
                start, end = len(fetched), time.monotonic() + seconds
                while time.monotonic() < end:
                    if busy:  # the page changes: a message ends every few tenths
                        settle(billing, send(billing))
                    page.wait_for_timeout(300)
                return len(fetched) - start
            assert fetches_in(3) == 0  # nothing changed: nothing fetched
            picker.select_option("1")
            page.wait_for_timeout(500)
            assert streams[-1].endswith("every=1")
            assert fetches_in(4.5, busy=True) >= 3  # pushed: it changed each second
            picker.select_option("off")
            page.wait_for_timeout(1500)  # one on its way may land
            assert fetches_in(3, busy=True) == 0
            # kept by this browser
            page.reload()
            assert page.get_by_label("refresh live parts every").input_value() == "off"
            page.get_by_label("refresh live parts every").select_option("1")
            # hidden: nothing fetched, however it changes; shown again: at once
            page.evaluate("""() => {
                Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
                document.dispatchEvent(new Event('visibilitychange')); }""")
            page.wait_for_timeout(1500)
            assert fetches_in(3, busy=True) == 0
            shown = len(fetched)
            page.evaluate("""() => {
                Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
                document.dispatchEvent(new Event('visibilitychange')); }""")
            page.wait_for_timeout(500)
            assert len(fetched) > shown
            # a browser without EventSource polls at the rate
            old = browser.new_page()
            old.add_init_script("delete window.EventSource")
            polled: list[float] = []
            old.on("request", lambda req: polled.append(time.monotonic())
                   if req.url == server.base + "/" and req.resource_type == "fetch" else None)
            old.goto(server.base + "/", timeout=15000)
            old.wait_for_timeout(4500)
            assert len(polled) >= 3  # picked 1 s, kept by this browser
        finally:
            browser.close()


def test_shift_click_chooses_every_row_between(make_queue, daemon, web_server, tmp_path):
    sync_playwright, _axe = _need_browser()
    procs = _queues(make_queue, daemon, tmp_path)
    etl = procs["etl"]
    failed = [send(etl, param1="row", param2=str(n)) for n in range(6)]
    for msg_id in failed:
        settle(etl, msg_id)
    server = web_server()
    with sync_playwright() as pw:
        browser = _browser(pw, tmp_path, viewport=WIDE)
        try:
            page = browser.new_page()
            page.goto(server.base + "/q/etl?state=err", timeout=15000)
            boxes = page.locator("input.pick")
            assert boxes.count() == 6
            boxes.nth(1).click()
            boxes.nth(4).click(modifiers=["Shift"])
            assert [boxes.nth(n).is_checked() for n in range(6)] == [
                False, True, True, True, True, False]
            boxes.nth(2).click()  # cleared, and a shift-click from it clears the range
            boxes.nth(4).click(modifiers=["Shift"])
            assert [boxes.nth(n).is_checked() for n in range(6)] == [
                False, True, False, False, False, False]
            # the chosen rows are what Retry chosen sends
            boxes.nth(0).click()
            boxes.nth(3).click(modifiers=["Shift"])
            assert [boxes.nth(n).is_checked() for n in range(6)] == [
                True, True, True, True, False, False]
            chosen = [boxes.nth(n).get_attribute("value") for n in range(6)
                      if boxes.nth(n).is_checked()]
            assert len(chosen) == 4
            page.get_by_role("button", name="Retry chosen").click()
            page.locator("#bulk-done", has_text="retry: 4 of 4").wait_for(timeout=20000)
        finally:
            browser.close()


def test_the_search_box_completes_and_acts_on_all_it_matches(make_queue, daemon, web_server,
                                                              tmp_path):
    # issue 48: the filter language in the one box, completed as a key or a queue
    # name begins; the bulk actions on the whole filtered selection, asked first
    sync_playwright, _axe = _need_browser()
    procs = _queues(make_queue, daemon, tmp_path)
    etl = procs["etl"]
    failed = [send(etl, param1="row", param2=str(n)) for n in range(3)]
    for msg_id in failed:
        settle(etl, msg_id)
    server = web_server()
    asked: list[str] = []
    with sync_playwright() as pw:
        browser = _browser(pw, tmp_path, viewport=WIDE)
        try:
            page = browser.new_page()
            page.on("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
            page.goto(server.base + "/", timeout=15000)
            box = page.get_by_label("search all queues")
            box.fill("state:err qu")
            box.dispatch_event("input")
            offered = page.evaluate("Array.from(document.querySelectorAll("
                                    "'#search-keys option')).map(o => o.value)")
            assert "state:err queue:etl" in offered and "state:err queue:billing" in offered
            box.fill("state:err queue:etl param1:row")
            box.press("Enter")
            page.wait_for_url("**/search?q=*", timeout=10000)
            button = page.get_by_role("button", name="Delete all 3 matching")
            page.locator("#matches-by-queue").wait_for(timeout=10000)
            button.click()
            page.locator("#bulk-done", has_text="delete: 3 of 3 matching, in 1 queue(s)"
                         ).wait_for(timeout=20000)
            assert asked == ["Delete all 3 matching messages, in every queue above?"]
            assert etl.call("counts")["counts"]["err"] == 0
            # a typo in a key is said, not searched
            page.goto(server.base + "/search?q=stat%3Aerr", timeout=15000)
            assert "no key 'stat'" in page.content()
        finally:
            browser.close()


def test_the_fifth_queues_pause_is_a_few_keys_away(make_queue, daemon, web_server, tmp_path):
    # issue 48 item 7: 32 Tab stops to reach the fifth queue's pause; now one Tab stop
    # a queue, the arrows across its controls and to the queues above and below
    sync_playwright, _axe = _need_browser()
    procs = _queues(make_queue, daemon, tmp_path)
    server = web_server()
    with sync_playwright() as pw:
        browser = _browser(pw, tmp_path, viewport=WIDE)
        try:
            page = browser.new_page()
            page.goto(server.base + "/", timeout=15000)
            said = ("document.activeElement.getAttribute('aria-label') || "
                    "document.activeElement.textContent.trim()")
            keys = 0
            while page.evaluate(said) != "webhook":  # the fifth queue's row
                page.keyboard.press("Tab")
                keys += 1
                assert keys < 40, page.evaluate(said)
            while page.evaluate(said) != "pause queue webhook":
                page.keyboard.press("ArrowRight")
                keys += 1
                assert keys < 60, page.evaluate(said)
            assert keys <= 20, keys
            # up and down keep the place across the rows; Enter acts there
            page.keyboard.press("ArrowUp")
            assert page.evaluate(said) == "pause queue relay"
            page.keyboard.press("ArrowDown")
            assert page.evaluate(said) == "pause queue webhook"
            page.keyboard.press("Enter")
            page.get_by_role("button", name="resume queue webhook").wait_for(timeout=10000)
            assert page.evaluate(said) == "resume queue webhook"
            assert procs["webhook"].call("counts")["admin"] == "PAUSE"
            # Shift+Tab goes back a queue: to the relay row's own stop
            page.keyboard.press("Shift+Tab")
            assert page.evaluate(said) == "relay"
        finally:
            browser.close()
