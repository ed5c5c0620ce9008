"""The console's actions on a root with several queues, the built-in ones'
names among them (issue 48 items 1 and 7), in a real browser: Retry chosen
and Delete chosen submit although the form's *move to* choice is required
(it is the move's alone); Delete chosen, the bulk actions on all that match,
and *down* on any queue ask first, and a dismissed question does nothing."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import sys

from daemon_util import send, settle
from test_console_browser import FAILING, _browser, _need_browser
from web_support import web_server  # noqa: F401

QUEUES = ("etl", "billing", "relay", "cleaner", "webhook")


def test_chosen_rows_and_down_on_a_root_of_several_queues(make_queue, daemon, web_server,
                                                          tmp_path):
    sync_playwright, _axe = _need_browser()
    procs = {}
    for name in QUEUES:
        if name == "etl":
            make_queue(name, FAILING, shebang=f"#!{sys.executable}",
                       env_vars={"GO_FILE": str(tmp_path / "go")})
        else:
            make_queue(name, "echo done >&3")
        procs[name] = daemon(name)
    etl = procs["etl"]
    failed = [send(etl, param1="row", param2=str(n)) for n in (1, 2, 3, 4)]
    for msg_id in failed:
        settle(etl, msg_id)
    server = web_server()
    asked: list[str] = []
    with sync_playwright() as pw:
        browser = _browser(pw, tmp_path, viewport={"width": 1400, "height": 900})
        try:
            page = browser.new_page()
            answer = {"yes": False}

            def on_dialog(dialog) -> None:
                asked.append(dialog.message)
                dialog.accept() if answer["yes"] else dialog.dismiss()
            page.on("dialog", on_dialog)
            # Retry chosen submits, with other queues to move to in the same form
            page.goto(server.base + "/q/etl?state=err", timeout=15000)
            assert page.locator("#dest-chosen option").count() == len(QUEUES)  # + "choose"
            page.get_by_label(f"choose {failed[0]}").check()
            page.get_by_role("button", name="Retry chosen").click()
            page.locator("#bulk-done", has_text="retry: 1 of 1").wait_for(timeout=20000)
            assert asked == []  # a retry is asked nothing
            settle(etl, failed[0])
            # Delete chosen asks; dismissed, nothing is deleted
            page.goto(server.base + "/q/etl?state=err", timeout=15000)
            page.get_by_label(f"choose {failed[1]}").check()
            page.get_by_role("button", name="Delete chosen").click()
            assert asked == ["Delete the chosen messages?"]
            assert etl.call("counts")["counts"]["err"] == 4
            # accepted, it is
            answer["yes"] = True
            page.get_by_role("button", name="Delete chosen").click()
            page.locator("#bulk-done", has_text="delete: 1 of 1").wait_for(timeout=20000)
            assert etl.call("counts")["counts"]["err"] == 3
            # down asks too, on any queue (relay's included); dismissed, it stays up
            answer["yes"] = False
            page.goto(server.base + "/", timeout=15000)
            page.get_by_role("button", name="down queue relay").click()
            assert asked[-1] == ("Take queue relay down? It stops taking and running "
                                 "messages.")
            assert procs["relay"].call("counts")["admin"] == "UP"
            # and the bulk action on all that match says how many
            page.goto(server.base + "/q/etl?state=err", timeout=15000)
            page.get_by_role("button", name="Retry all 3 matching").click()
            assert asked[-1] == "Retry all 3 matching messages?"
            assert etl.call("counts")["counts"]["err"] == 3
        finally:
            browser.close()


def test_failures_are_told_apart_and_found_by_their_words(make_queue, daemon, web_server,
                                                          tmp_path):
    # issue 48 item 2: the err tab, a search and a group's members show each one's last
    # line (its exception), with params and time; the last lines are searchable; the
    # group page has chosen rows
    sync_playwright, _axe = _need_browser()
    make_queue("etl", FAILING, shebang=f"#!{sys.executable}",
               env_vars={"GO_FILE": str(tmp_path / "go")})
    make_queue("billing", "echo done >&3")
    etl = daemon("etl")
    daemon("billing")
    failed = {n: send(etl, param1="row", param2=str(n)) for n in (7, 12, 30)}
    for msg_id in failed.values():
        settle(etl, msg_id)
    server = web_server()
    code, found = server.get_json("/q/etl/search.json?text=ValueError&state=err")
    assert code == 200 and sorted(r["id"] for r in found["rows"]) == sorted(failed.values())
    code, found = server.get_json("/q/etl/search.json?text=db01+30&state=err")
    assert [r["id"] for r in found["rows"]] == [failed[30]]
    with sync_playwright() as pw:
        browser = _browser(pw, tmp_path, viewport={"width": 1400, "height": 900})
        try:
            page = browser.new_page()
            page.on("dialog", lambda dialog: dialog.accept())
            page.goto(server.base + "/q/etl?state=err", timeout=15000)
            for n in failed:  # each err row's last line
                assert page.locator("#live-queue span.why",
                                    has_text=f"ValueError: bad row {n} on db01").is_visible()
            page.goto(server.base + "/search?q=ValueError", timeout=15000)  # each hit's too
            page.locator("#matches-by-queue").wait_for(timeout=10000)
            for n in failed:
                assert page.locator("span.why", has_text=f"bad row {n} on db01").is_visible()
            page.goto(server.base + "/q/etl?state=err", timeout=15000)
            page.get_by_role("link", name="ValueError: bad row N on dbN").first.click()
            page.locator("#group-reason").wait_for(timeout=10000)
            row = page.locator("tr", has_text=failed[12])
            assert "row 12" in row.inner_text() and "bad row 12 on db01" in row.inner_text()
            page.get_by_label(f"choose {failed[12]}").check()
            page.get_by_role("button", name="Retry chosen").click()
            page.locator("#bulk-done", has_text="retry: 1 of 1").wait_for(timeout=20000)
        finally:
            browser.close()
    settle(etl, failed[12])
    assert etl.call("counts")["counts"]["err"] == 3  # retried, and failed again


def test_the_live_refresh_keeps_the_keyboard_focus(make_queue, daemon, web_server, tmp_path):
    # issue 48 item 3: the dashboard's live part is swapped while messages come and go;
    # the focused "pause" stays focused (it went to the page's body within 16 s)
    sync_playwright, _axe = _need_browser()
    for name in ("etl", "billing"):
        make_queue(name, "echo done >&3")
    procs = {name: daemon(name) for name in ("etl", "billing")}
    server = web_server()
    with sync_playwright() as pw:
        browser = _browser(pw, tmp_path, viewport={"width": 1400, "height": 900})
        try:
            page = browser.new_page()
            page.goto(server.base + "/", timeout=15000)
            pause = page.get_by_role("button", name="pause queue billing")
            pause.focus()
            live = page.locator(".live[data-refresh]").first
            for swaps in range(1, 4):  # three swaps of changed content, the focus kept
                before = live.inner_html()
                for _n in range(3):
                    settle(procs["etl"], send(procs["etl"]))
                page.wait_for_function(
                    "(old) => document.querySelector('.live[data-refresh]').innerHTML !== old",
                    arg=before, timeout=20000)
                focused = page.evaluate("document.activeElement.getAttribute('aria-label')")
                assert focused == "pause queue billing", (swaps, focused)
        finally:
            browser.close()
