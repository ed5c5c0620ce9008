"""One real browser (Debian's headless Chromium via Playwright) using the web UI:
dashboard -> new-message form (honouring form.json) -> message page whose
coloured live tail grows without a reload, until the message is done."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import json
import os

from conftest import need
from web_support import web_server  # noqa: F401

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic"]
# What the tail's terminal shows: each line's text, and its first cell's colour
# ([number, "palette" | "rgb" | "default"]), bold, underline and inverse.
SHOWN = """() => {
  const term = document.getElementById("tail").rqTerm, buf = term.buffer.active, out = [];
  for (let y = 0; y < buf.length; y++) {
    const line = buf.getLine(y), text = line.translateToString(true);
    if (!text) continue;
    const cell = line.getCell(text.search(/\\S/));
    const mode = cell.isFgRGB() ? "rgb" : cell.isFgPalette() ? "palette" : "default";
    out.push({text: text.trim(), fg: [cell.getFgColor(), mode], bold: !!cell.isBold(),
              underline: !!cell.isUnderline(), inverse: !!cell.isInverse()});
  }
  return out;
}"""
# Prints a green line, waits for the test's go-file, prints a red line, is done.
SCRIPT = r"""
printf '\033[32mgreen line one\033[0m\n'
for i in $(seq 1 300); do [ -e "$GO_FILE" ] && break; sleep 0.05; done
printf '\033[1;31mred line two\033[0m\n'
echo "done painted" >&3
"""
FORM = {"default": "hidden",
        "mesg_param1": {"label": "Colour name", "help": "Which colour to paint"},
        "mesg_param2": {"hidden": True, "value": "from-form-json"}}


def test_browser_sends_a_message_and_watches_its_coloured_tail(make_queue, daemon, web_server,
                                                              layout, tmp_path):
    need(os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} (Debian chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need(False, "playwright from PyPI")
    server = web_server()
    go_file = tmp_path / "go"
    entry = make_queue("paint", SCRIPT, env_vars={"GO_FILE": str(go_file)})
    (entry / "form.json").write_text(json.dumps(FORM))
    make_queue("paint", SCRIPT, env_vars={"GO_FILE": str(go_file)})  # re-install: links form
    daemon("paint")
    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
            args=ARGS)
        try:
            _drive(browser.new_page(), server, go_file)
        finally:
            browser.close()


def _drive(page, server, go_file) -> None:
    # Given the dashboard lists the queue
    page.goto(server.base + "/", timeout=15000)
    page.get_by_role("link", name="paint", exact=True).wait_for(timeout=10000)
    # When the user opens the form: form.json's label and help show, unlisted fields don't
    page.get_by_role("link", name="new message").click()
    page.get_by_label("Colour name").wait_for(timeout=10000)
    assert page.get_by_text("Which colour to paint").is_visible()
    assert page.locator("input[name=mesg_dest]").count() == 0
    page.get_by_label("Colour name").fill("<b>teal</b>")
    page.locator("#send").click()
    # Then the message page shows the live tail: green first, without a reload
    page.wait_for_url("**/q/paint/*", timeout=10000)
    page.evaluate("window.__sameDocument = true")
    page.wait_for_function(f"({SHOWN})().some(l => l.text === 'green line one')",
                           timeout=15000)
    assert not any(line["text"] == "red line two" for line in page.evaluate(SHOWN))
    go_file.write_text("go")
    page.wait_for_function(f"({SHOWN})().some(l => l.text === 'red line two')", timeout=15000)
    lines = {line["text"]: line for line in page.evaluate(SHOWN)}
    assert lines["green line one"]["fg"] == [2, "palette"]  # ANSI green
    assert lines["red line two"]["fg"] == [1, "palette"] and lines["red line two"]["bold"]
    page.locator("#msg-state", has_text="done").wait_for(timeout=15000)
    page.locator("#tail-state", has_text="ended: done").wait_for(timeout=10000)
    assert page.evaluate("window.__sameDocument") is True
    # and the user's input was escaped, the hidden form.json field sent
    assert page.get_by_text('"<b>teal</b>"').is_visible()
    assert page.locator("b", has_text="teal").count() == 0
    assert page.get_by_text('"from-form-json"').is_visible()


# ---------------------------------------------------------------- observing (issue 17)
HUNT = r"""
[ -e "$RQ_MSG_DIR/../../../fixed" ] && { echo "done fixed" >&3; exit 0; }
case "$RQ_PARAM1" in
  db) echo "err database down on db0$RQ_PARAM2" >&3 ;;
  disk) echo "err disk full on sd$RQ_PARAM2" >&3 ;;
  *) echo "done fine" >&3 ;;
esac
"""
PHONE = {"width": 390, "height": 844}


def _shot(page, shots, name):
    path = shots / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def test_browser_dashboard_graphs_search_and_bulk_retry(make_queue, daemon, web_server, layout,
                                                         tmp_path):
    need(os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} (Debian chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need(False, "playwright from PyPI")
    from daemon_util import send, settle

    server = web_server()
    make_queue("hunt", HUNT)
    proc = daemon("hunt")
    db = [send(proc, param1="db", param2=str(n)) for n in range(3)]
    disk = [send(proc, param1="disk", param2=str(n)) for n in range(2)]
    fine = send(proc, param1="ok")
    for msg_id in [*db, *disk, fine]:
        settle(proc, msg_id)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
            args=ARGS, viewport={"width": 1280, "height": 800})
        try:
            page = browser.new_page()
            _dashboard(page, server, shots)
            _search_and_retry(page, server, shots, layout, proc, db, disk)
            _message_page(page, server, shots, disk[0], fine)
            phone = browser.new_page()
            phone.set_viewport_size(PHONE)
            _phone(phone, server, shots)
        finally:
            browser.close()


def _dashboard(page, server, shots) -> None:
    # the dashboard graphs what ended (server-made SVG) and lists the failure groups
    page.goto(server.base + "/", timeout=15000)
    spark = page.locator('svg.spark[aria-label^="ended per minute"]').first
    spark.wait_for(timeout=10000)
    label = spark.get_attribute("aria-label")
    assert "peak none" not in label and "peak 0," not in label, label
    assert page.locator("svg.spark polyline").count() >= 4
    assert page.get_by_text("database down on dbN").is_visible()
    assert page.get_by_text("disk full on sdN").is_visible()
    _shot(page, shots, "dashboard-1280")


def _search_and_retry(page, server, shots, layout, proc, db, disk) -> None:
    from daemon_util import settle

    # the queue page opens on the tab holding messages (err here, que is empty)
    page.goto(server.base + "/q/hunt", timeout=15000)
    assert page.locator(".tabs a.on").inner_text() == "err (5)"
    page.get_by_label("search params, status, tags").fill("database")
    page.locator("#search").click()
    page.locator("#match-count", has_text="of 3").wait_for(timeout=10000)
    shown = page.locator("#live-queue td[data-label=Message] a").all_inner_texts()
    assert sorted(shown) == sorted(db)
    _shot(page, shots, "queue-search-1280")
    # retry all that match: only the database ones move (and, fixed, end done)
    (layout.queue_dir("hunt") / "fixed").write_text("")
    page.once("dialog", lambda dialog: dialog.accept())  # "Retry all 3 matching messages?"
    page.get_by_role("button", name="Retry all 3 matching").click()
    page.locator("#bulk-done", has_text="retry: 3 of 3 matching").wait_for(timeout=20000)
    for msg_id in db:
        assert settle(proc, msg_id)["state"] == "done"
    for msg_id in disk:
        assert proc.call("status", msg_id=msg_id)["state"] == "err"
    # and the page catches up by itself (no reload): none is left in err to match
    # "database" (the tabs count what matches the search; done, their status is "fixed")
    page.evaluate("window.__sameDocument = true")
    page.locator(".tabs a", has_text="err (0)").wait_for(timeout=20000)
    page.locator("#no-messages").wait_for(timeout=10000)
    assert page.evaluate("window.__sameDocument") is True
    _shot(page, shots, "queue-after-retry-1280")


def _message_page(page, server, shots, err_id, done_id) -> None:
    # an err message offers retry in place and no destroy; a done one with no output says so
    page.goto(f"{server.base}/q/hunt/{err_id}", timeout=15000)
    actions = page.locator("#msg-actions button").all_inner_texts()
    assert "retry" in actions and "destroy" not in actions, actions
    assert page.locator("#runs").is_visible()
    assert page.locator("table", has_text="Peak RSS").locator("tbody tr").count() == 1
    _shot(page, shots, "message-err-1280")
    page.goto(f"{server.base}/q/hunt/{done_id}", timeout=15000)
    assert page.locator("#no-output", has_text="No output").is_visible()
    assert page.locator("pre#tail").count() == 0


def _phone(page, server, shots) -> None:
    for path, name in (("/", "dashboard"), ("/q/hunt?state=done", "queue")):
        page.goto(server.base + path, timeout=15000)
        page.locator("h1").wait_for(timeout=10000)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{name} is {overflow}px wider than a phone"
        _shot(page, shots, f"{name}-phone")
