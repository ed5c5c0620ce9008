"""The message page's parts that depend on its state and history: the actions
that can apply to it now, how far along it is, why it failed, each run's
resource use (from its timeline), and what to say of its output."""

from __future__ import annotations

from typing import Any

from rqsys.web import timeshtml
from rqsys.web.context import Web
from rqsys.web.html import e, link, post_button, table

ENDED = ("done", "err", "relayed")


def actions(web: Web, queue: str, msg_id: str, state: str) -> str:
    """Only what the daemon would do for a message in ``state``."""
    here = mpath = web.msg_path(queue, msg_id)
    back = web.queue_path(queue)
    buttons = []
    if state == "prep":
        buttons.append(post_button(mpath, "commit", {"_method": "commit", "back": here}))
    if state == "err":  # runs again as it was, in place (same id)
        buttons.append(post_button(mpath, "retry", {"_method": "retry", "back": here}))
    if state == "que":
        buttons.append(post_button(mpath + "/run_now", "run now", {"back": here}))
    buttons.append(post_button(mpath + "/clone", "clone", {"x_format": "html"}))
    if state == "run":
        buttons.append(post_button(mpath, "destroy", {"_method": "destroy", "back": back},
                                   danger=True, confirm="Destroy this message (kills its script)?"))
    else:
        buttons.append(post_button(mpath, "delete", {"_method": "delete", "back": back},
                                   danger=True, confirm="Delete this message?"))
    return f'<div class="actions" id="msg-actions">{"".join(buttons)}</div>'


def runs(events: list[dict[str, Any]]) -> str:
    """One row per run: when, where, how it ended and what it used (``wait4``)."""
    rows: list[dict[str, Any]] = []
    for item in events:
        if item.get("ev") == "started":
            rows.append({"start": item})
        elif item.get("ev") == "exit" and rows and "exit" not in rows[-1]:
            rows[-1]["exit"] = item
    if not rows:
        return ""
    return '<h2 id="runs">Runs</h2>' + table(
        ["Run", "Started", "Host / pid", "Ended by", "Ran", "User CPU", "System CPU",
         "Peak RSS"], [_run_row(n, row) for n, row in enumerate(rows, 1)],
        numeric=range(4, 8))


def _run_row(n: int, row: dict[str, Any]) -> list[str]:
    start, end = row["start"], row.get("exit", {})
    if "signal" in end:
        how = f"signal {end['signal']}"
    elif "exit_status" in end:
        how = f"exit {end['exit_status']}"
    else:
        how = "running" if not end else "?"
    rss = end.get("maxrss_kb")
    return [e(start.get("run", n)), e(timeshtml.when(start.get("t"))),
            e(f"{start.get('host', '')} / {start.get('pid', start.get('handed', ''))}"), e(how),
            e(timeshtml.seconds(end.get("run_s"))), e(timeshtml.seconds(end.get("utime_s"))),
            e(timeshtml.seconds(end.get("stime_s"))),
            e(f"{rss / 1024:.1f} MiB" if isinstance(rss, int | float) else "")]


def no_output(state: str, files: list[str], empty: bool) -> str:
    """What the Output section says instead of an empty box ("" when there is output)."""
    if state in ENDED and (not files or empty):
        return '<p class="muted" id="no-output">No output: the script wrote nothing.</p>'
    if state in ("que", "prep") and not files:
        return '<p class="muted" id="no-output">No output yet: it has not run.</p>'
    return ""


def progress_bar(progress: dict[str, Any] | None, ident: str = "msg-progress") -> str:
    """How far along a running message says it is (its ``N%`` or ``N/M`` status)."""
    if not progress:
        return ""
    fraction = float(progress["fraction"])
    said = (f"{progress['done']:,}/{progress['total']:,}" if "total" in progress
            else f"{fraction * 100:.0f}%")
    return (f'<span class="progress"><progress id="{e(ident)}" max="1" value="{fraction:g}" '
            f'aria-label="progress {e(said)}"></progress> <span class="num">{e(said)}</span>'
            "</span>")


def why_failed(web: Web, queue: str, msg: dict[str, Any]) -> str:
    """The err panel: RQ's status text and the last lines the run wrote, linked
    to its whole log."""
    if msg["state"] != "err":
        return ""
    lines = msg.get("last_lines") or []
    log = web.path("q", queue, msg["msg_id"], "log", "stdio.log")
    said = (f'<pre class="lastlines" id="last-lines">{e(chr(10).join(lines))}</pre>'
            f'<p>{link(log, "the whole output")}</p>' if lines
            else '<p class="muted">The run wrote nothing before it ended.</p>')
    return ('<section class="why" id="why-failed" aria-labelledby="why-title">'
            '<h2 id="why-title">Why it failed</h2>'
            f'<p class="mono" id="err-status">{e(msg.get("status_text", ""))}</p>'
            f"{said}</section>")
