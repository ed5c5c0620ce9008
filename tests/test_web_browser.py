"""One real browser (Debian's headless Chromium via Playwright) using the web UI:
dashboard -> new-message form (honouring form.json) -> message page whose
coloured live tail grows without a reload, until the message is done."""
# ruff: noqa: F811  (pytest fixtures imported from test_web_support are parameters here)

from __future__ import annotations

import json
import os

from conftest import need
from test_web_support import web_server  # noqa: F401

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic"]
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
    page.locator("#tail span.ansi-32", has_text="green line one").wait_for(timeout=15000)
    assert page.locator("#tail", has_text="red line two").count() == 0
    go_file.write_text("go")
    page.locator("#tail span.ansi-31.ansi-bold", has_text="red line two").wait_for(timeout=15000)
    page.locator("#msg-state", has_text="done").wait_for(timeout=15000)
    page.locator("#tail-state", has_text="ended: done").wait_for(timeout=10000)
    assert page.evaluate("window.__sameDocument") is True
    # and the user's input was escaped, the hidden form.json field sent
    assert page.get_by_text('"<b>teal</b>"').is_visible()
    assert page.locator("b", has_text="teal").count() == 0
    assert page.get_by_text('"from-form-json"').is_visible()
