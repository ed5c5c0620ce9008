"""The console in a real browser (Debian's Chromium via Playwright): every page in
both themes at 1,400 and 390 px wide, checked by axe-core (no serious or critical
WCAG 2.1 AA violation) and kept as screenshots; why a message failed and its
group's page; a running message's progress; the search across queues; chosen
rows; and the tail as a terminal shows it."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import json
import os
import sys

from conftest import need, wait_for
from daemon_util import send, settle
from test_web_browser import ARGS, CHROMIUM, SHOWN
from web_support import web_server  # noqa: F401

WIDTHS = {"wide": {"width": 1400, "height": 900}, "phone": {"width": 390, "height": 844}}
THEMES = ("light", "dark")
AXE_RULES = {"runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]},
             "resultTypes": ["violations"]}
FAILING = """
import os, sys, time
print("\\x1b[1mreading rows\\x1b[0m", flush=True)
if os.environ["RQ_PARAM1"] == "slow":
    for n in range(1, 41):
        os.write(3, f"run {n}/40 rows\\n".encode())
    while not os.path.exists(os.environ["GO_FILE"]):
        time.sleep(0.05)
    os.write(3, b"done all rows\\n")
    sys.exit(0)
if os.environ["RQ_PARAM1"] == "ok":
    os.write(3, b"done fine db01\\n")
    sys.exit(0)
raise ValueError(f"bad row {os.environ['RQ_PARAM2']} on db01")
"""
PAINT = r"""
printf '\033[38;5;18mnavy two-five-six\033[0m \033[34mblue sixteen\033[0m\n'
printf '\033[38;2;0;0;135mnavy truecolor\033[0m \033[44;30mblack on blue\033[0m\n'
echo "done painted" >&3
"""
# The tail's cases: 300 KiB before them (the page opens on the last 256 KiB), then 16,
# 256 and true colours, bold, underline, inverse, a line rewritten by \\r, an OSC
# title, and an escape split across two polls (written a second apart).
TERMINAL = r"""
head -c 307200 /dev/zero | tr '\0' 'x' | fold -w 100
printf '\033]0;a window title\007'
printf 'plain line\n'
printf '\033[32mgreen sixteen\033[0m\n'
printf '\033[38;5;208morange two-five-six\033[0m\n'
printf '\033[1;38;2;255;100;0mbold truecolor\033[0m\n'
printf '\033[4munderlined\033[0m\n'
printf '\033[7minverse\033[0m\n'
printf 'progress 10%%\rprogress 99%%\n'
printf '\033[3'
sleep 1.5
printf '1msplit red\033[0m\n'
echo "done painted" >&3
"""


def _browser(pw, tmp_path, **options):
    return pw.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
        args=ARGS, **options)


def _need_browser():
    need(os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} (Debian chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need(False, "playwright from PyPI")
    try:
        from axe_playwright_python.sync_playwright import Axe
    except ImportError:
        need(False, "axe-playwright-python from PyPI")
    return sync_playwright, Axe


def _serious(axe, page):
    found = axe.run(page, options=AXE_RULES).response["violations"]
    return [(v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3]) for v in found
            if v["impact"] in ("serious", "critical")]


def test_every_page_in_both_themes_and_widths_is_accessible_and_fits(
        make_queue, daemon, web_server, layout, tmp_path):
    sync_playwright, Axe = _need_browser()
    server = web_server()
    go_file = tmp_path / "go"
    make_queue("etl", FAILING, shebang=f"#!{sys.executable}",
               env_vars={"GO_FILE": str(go_file)}, num_workers=2)
    make_queue("other", 'echo "done" >&3\n')
    make_queue("paint", PAINT)  # a script's own colours, dark blue on the dark terminal
    proc = daemon("etl")
    daemon("other")
    paint = daemon("paint")
    painted = send(paint)
    failed = [send(proc, param1="row", param2=str(n)) for n in (7, 12)]
    done = send(proc, param1="ok")
    for msg_id in [*failed, done]:
        settle(proc, msg_id)
    settle(paint, painted)
    running = send(proc, param1="slow")
    wait_for(lambda: proc.call("status", msg_id=running)["status"] == "40/40 rows")
    group = proc.call("groups")["groups"][0]["key"]
    prep = proc.call("create", msg={"param1": "ok"}, state="prep")["msg_id"]
    pages = {"dashboard": "/", "queue": "/q/etl?state=err", "message-err": f"/q/etl/{failed[0]}",
             "message-run": f"/q/etl/{running}", "group": f"/q/etl/groups/{group}",
             "search": "/search?q=db01", "new-message": "/q/etl/new_message",
             "trends": "/q/etl/trends?range=1h", "message-prep": f"/q/etl/{prep}",
             "timers": "/timers", "triggers": "/triggers", "not-found": "/q/nosuch",
             "audit": "/audit",
             "message-colours": f"/q/paint/{painted}"}
    shots = tmp_path / "screenshots"
    shots.mkdir()
    problems = []
    axe = Axe()
    with sync_playwright() as pw:
        browser = _browser(pw, tmp_path)
        try:
            for theme in THEMES:
                for width, size in WIDTHS.items():
                    page = browser.new_page()
                    page.set_viewport_size(size)
                    page.emulate_media(color_scheme=theme)
                    for name, path in pages.items():
                        page.goto(server.base + path, timeout=15000)
                        page.locator("h1").wait_for(timeout=10000)
                        if name in ("message-run", "message-colours"):
                            page.wait_for_function(f"({SHOWN})().length > 0", timeout=15000)
                        wide = page.evaluate(
                            "document.documentElement.scrollWidth - window.innerWidth")
                        if wide > 1:
                            problems.append(f"{name} {theme} {width}: {wide}px sideways")
                        problems += [f"{name} {theme} {width}: {v}" for v in _serious(axe, page)]
                        page.screenshot(path=str(shots / f"{name}-{theme}-{width}.png"),
                                        full_page=True)
                    page.close()
        finally:
            browser.close()
    go_file.write_text("go")
    settle(proc, running)
    print(f"screenshots: {shots}")
    assert problems == []


def test_why_it_failed_its_group_progress_search_and_chosen_rows(make_queue, daemon,
                                                                  web_server, layout, tmp_path):
    sync_playwright, _axe = _need_browser()
    server = web_server()
    go_file = tmp_path / "go"
    make_queue("etl", FAILING, shebang=f"#!{sys.executable}",
               env_vars={"GO_FILE": str(go_file)}, num_workers=2)
    proc = daemon("etl")
    failed = [send(proc, param1="row", param2=str(n)) for n in (7, 12, 30)]
    for msg_id in failed:
        settle(proc, msg_id)
    running = send(proc, param1="slow")
    wait_for(lambda: proc.call("status", msg_id=running)["status"] == "40/40 rows")
    with sync_playwright() as pw:
        browser = _browser(pw, tmp_path, viewport={"width": 1400, "height": 900})
        try:
            page = browser.new_page()
            # the queue page's group, named by the exception, leads to its messages
            page.goto(server.base + "/q/etl?state=err", timeout=15000)
            page.get_by_role("link", name="ValueError: bad row N on dbN").first.click()
            page.locator("#group-reason").wait_for(timeout=10000)
            shown = page.locator("td[data-label=Message] a").all_inner_texts()
            assert sorted(shown) == sorted(failed)
            # a message says why it failed: the exception's lines, not only its exit
            page.get_by_role("link", name=failed[0]).click()
            why = page.locator("#why-failed")
            why.wait_for(timeout=10000)
            assert "ValueError: bad row 7 on db01" in why.inner_text()
            assert "Traceback (most recent call last):" in why.inner_text()
            # a running one shows how far along it is
            page.goto(f"{server.base}/q/etl/{running}", timeout=15000)
            bar = page.locator("#msg-progress")
            assert bar.get_attribute("value") == "1"
            assert page.get_by_text("40/40", exact=True).is_visible()
            # the header's search box finds across queues and states
            page.get_by_label("search all queues").fill("row")
            page.keyboard.press("Enter")
            page.locator("#matches-by-queue").wait_for(timeout=10000)
            assert page.get_by_role("link", name="3", exact=True).is_visible()
            # two chosen rows deleted, the third kept
            page.goto(server.base + "/q/etl?state=err", timeout=15000)
            page.get_by_label(f"choose {failed[0]}").check()
            page.get_by_label(f"choose {failed[1]}").check()
            page.once("dialog", lambda dialog: dialog.accept())  # "Delete the chosen ...?"
            page.get_by_role("button", name="Delete chosen").click()
            page.locator("#bulk-done", has_text="delete: 2 of 2").wait_for(timeout=20000)
            assert proc.call("status", msg_id=failed[2])["state"] == "err"
            assert proc.call("counts")["counts"]["err"] == 1
            # the theme the user picks is kept by this browser
            page.locator("#theme").click()
            assert page.evaluate("document.documentElement.dataset.theme") == "dark"
            page.reload()
            assert page.evaluate("document.documentElement.dataset.theme") == "dark"
        finally:
            browser.close()
    go_file.write_text("go")
    settle(proc, running)


def test_the_tail_shows_output_as_a_terminal_does(make_queue, daemon, web_server, layout,
                                                  tmp_path):
    sync_playwright, _axe = _need_browser()
    server = web_server()
    make_queue("paint", TERMINAL)
    proc = daemon("paint")
    msg_id = send(proc)
    with sync_playwright() as pw:
        browser = _browser(pw, tmp_path, viewport={"width": 1400, "height": 900})
        try:
            page = browser.new_page()
            page.goto(f"{server.base}/q/paint/{msg_id}", timeout=15000)
            page.wait_for_function(f"({SHOWN})().some(l => l.text === 'split red')",
                                   timeout=30000)
            page.locator("#tail-state", has_text="ended: done").wait_for(timeout=15000)
            lines = {line["text"]: line for line in page.evaluate(SHOWN)}
            assert lines["green sixteen"]["fg"] == [2, "palette"]
            assert lines["orange two-five-six"]["fg"] == [208, "palette"]
            truecolor = lines["bold truecolor"]
            assert truecolor["fg"] == [0xFF6400, "rgb"] and truecolor["bold"]
            assert lines["underlined"]["underline"] and lines["inverse"]["inverse"]
            assert lines["split red"]["fg"] == [1, "palette"]  # not "[31m" shown raw
            assert "progress 99%" in lines and "progress 10%" not in lines
            assert not any("title" in text or "\x1b" in text for text in lines)
            # it opened on the last 256 KiB: "load all" brings the rest
            more = page.locator("#tail-more")
            assert more.is_visible() and "256 KiB of 304 KiB" in more.inner_text()
            before = len(page.evaluate(SHOWN))
            more.get_by_role("button", name="Load all").click()
            page.wait_for_function(f"({SHOWN})().length > {before} + 300", timeout=30000)
            assert page.locator("#tail-more").is_hidden()
        finally:
            browser.close()
    assert json.dumps(proc.call("status", msg_id=msg_id)["state"]) == '"done"'
