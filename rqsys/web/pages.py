"""The HTML pages: dashboard, queue, message (with live tail) and new-message form."""

from __future__ import annotations

import json
import re
from typing import Any

import falcon

from rqsys import config
from rqsys.errors import ConfigError, RQError
from rqsys.observe import timeline
from rqsys.store import STATES
from rqsys.web import dashboard as observing
from rqsys.web import failures, logs, msgpage, pools, queuepage, timeshtml
from rqsys.web.context import Web
from rqsys.web.html import badge, e, link, post_button, query, render, table

FORM_FIELDS = ("dest", "src", "param1", "param2", "param3", "param4", "due", "max_count",
               "orig_msg_id", "force_remote", "priority", "timeout", "retry_max", "tags",
               "unique_key", "unique_for", "after", "after_policy")
# the form's inputs that are not text: (input type, what it takes)
FIELD_TYPES = {
    "due": ("datetime-local", "when it may run, in UTC (empty: now)"),
    "max_count": ("number", "runs before it ends in err (RQ's default: 15)"),
    "priority": ("number", "lower runs first (default 0)"),
    "timeout": ("number", "seconds a run may take"),
    "retry_max": ("number", "retries after a failure"),
    "unique_for": ("number", "seconds the unique key holds"),
    "force_remote": ("checkbox", "relay it even when dest is this host"),
    "tags": ("text", "words, by commas or spaces"),
    "after": ("text", "message URLs it runs after, by spaces"),
}
# the admin operations a queue's state offers: what changes it, and nothing that does not
ADMIN_BUTTONS = {"UP": ("pause", "down"), "PAUSE": ("resume", "down"), "DOWN": ("up",)}


# ---------------------------------------------------------------- dashboard
def dashboard(web: Web, req: falcon.Request, resp: falcon.Response) -> None:
    names = web.layout.queue_names()
    rows = [_dashboard_row(web, name) for name in names]
    headers = ["Queue", "Admin", *STATES, *observing.HEADERS, "Status", "Actions"]
    body = "<h1>Queues</h1>" + (table(headers, rows, numeric=range(2, 3 + len(STATES))) if rows else
                                '<p class="muted">No queues yet.</p>')
    unreachable = sum(row[1] == badge("?") for row in rows)
    live = live_block("dashboard", body + failures.section(web, names))
    render(web, resp, "Queues", [], live + pools.section(web) + _operational(unreachable))


def live_block(name: str, html: str, every: int = 5) -> str:
    """A part of a page that rq.js fetches again every ``every`` seconds (no reload)."""
    return f'<div id="live-{e(name)}" class="live" data-refresh="{every}">{html}</div>'


def _operational(unreachable: int) -> str:
    """The line RQ's monitoring (and its tests) look for on the home page."""
    if not unreachable:
        return '<p class="meta" id="qmgr">QUEUE MGR is OPERATIONAL</p>'
    return (f'<p class="meta error" id="qmgr">QUEUE MGR is DEGRADED: {unreachable} '
            "queue daemon(s) not answering</p>")


def _dashboard_row(web: Web, name: str) -> list[str]:
    qpath = web.queue_path(name)
    try:
        got = web.call(name, "counts")
    except RQError as exc:
        return [link(qpath, name), badge("?"), *["" for _ in STATES],
                *observing.stat_cells(None), f'<span class="error">{e(exc)}</span>', ""]
    counts = [_count(query(qpath, state=s), got["counts"].get(s, 0), s) for s in STATES]
    new = (f'<a href="{e(web.path("q", name, "new_message"))}" class="button" '
           f'aria-label="new message for {e(name)}">new message</a>')
    return [link(qpath, name), badge(got["admin"]), *counts,
            *observing.stat_cells(observing.stats_of(web, name)), e(got["status"]),
            f'<div class="actions">{new}'
            f'{_admin_buttons(web, name, web.path(""), got["admin"])}</div>']


def _count(href: str, n: int, state: str) -> str:
    """A state's count: a link to that tab when there is something to see (one
    tab stop fewer a row for each empty state), said as what it counts."""
    if not n:
        return '<span class="muted">0</span>'
    return f'<a href="{e(href)}" aria-label="{n:,} in {e(state)}">{n:,}</a>'


def _admin_buttons(web: Web, name: str, back: str, admin: str) -> str:
    """The buttons that change the queue's admin state from ``admin`` (a paused
    queue offers resume, not pause again)."""
    action = web.path("q", name, "adminoper")
    return "".join(post_button(action, op, {op: "1", "back": back}, danger=op == "down",
                               said=f"{op} queue {name}")
                   for op in ADMIN_BUTTONS.get(admin, ("up", "pause", "down")))


# ---------------------------------------------------------------- queue page
def queue_page(web: Web, req: falcon.Request, resp: falcon.Response, name: str) -> None:
    got = web.call(name, "counts")
    new = (link(web.path("q", name, "new_message"), "New message", "button primary")
           + link(web.path("q", name, "trends"), "Trends", "button"))
    body = (f"<h1>Queue {e(name)} {badge(got['admin'])}</h1>"
            f'<p class="muted">{e(got["status"])}</p>'
            f'<div class="actions">{new}'
            f"{_admin_buttons(web, name, web.queue_path(name), got['admin'])}</div>"
            + queuepage.body(web, req, name, got["counts"])
            + (live_block("groups", failures.section(web, [name], None))
               if got["counts"].get("err") else ""))
    render(web, resp, f"Queue {name}", [(web.queue_path(name), name)], body)


# ---------------------------------------------------------------- message page
def message_page(web: Web, req: falcon.Request, resp: falcon.Response, queue: str,
                 msg: dict[str, Any]) -> None:
    msg_id, state = msg["msg_id"], msg["state"]
    fields = [[e(k), f"<code>{e(json.dumps(v))}</code>"] for k, v in sorted(msg.items())
              if k not in ("_attachments", "status", "status_text", "state", "_timeline",
                           "progress", "last_lines", *timeline.TIME_FIELDS)]
    output = _logs(web, queue, msg_id, state)
    live = live_block("message", f'<p>Status: <span class="mono" id="msg-status">'
                      f'{e(msg.get("status", ""))}</span> '
                      f'{msgpage.progress_bar(msg.get("progress"))}</p>'
                      + _after_line(msg) + msgpage.actions(web, queue, msg_id, state)
                      + msgpage.why_failed(web, queue, msg))
    history = live_block("history", timeshtml.section(msg)
                         + msgpage.runs(msg.get("_timeline") or []))
    body = (f'<h1>Message <span class="mono">{e(msg_id)}</span> '
            f'<span id="msg-state" class="badge {e(state)}">{e(state)}</span></h1>'
            + (live + output + history if state == "run" else live + history)  # tail up top
            + "<h2>Fields</h2>" + table(["Field", "Value"], fields)
            + _attachments(web, queue, msg_id, msg["_attachments"])
            + ("" if state == "run" else output))
    crumbs = [(web.queue_path(queue), queue), (web.msg_path(queue, msg_id), msg_id)]
    render(web, resp, f"Message {msg_id}", crumbs, body)


def _after_line(msg: dict[str, Any]) -> str:
    """The messages this one runs after (its ``after``), linked."""
    after = msg.get("after") or []
    links = ", ".join(f'<a class="mono" href="{e(url)}">{e(url)}</a>' for url in after)
    return f'<p id="msg-after">After: {links}</p>' if after else ""


def _attachments(web: Web, queue: str, msg_id: str, found: dict[str, Any]) -> str:
    if not found:
        return ""
    rows = [[link(web.path("q", queue, msg_id, "attach", name), name),
             e(info["size"]), f'<span class="mono">{e(info["md5"])}</span>']
            for name, info in sorted(found.items())]
    return "<h2>Attachments</h2>" + table(["Name", "Size", "MD5"], rows)


def _logs(web: Web, queue: str, msg_id: str, state: str) -> str:
    files = logs.job_files(web, queue, state, msg_id)
    listing = " ".join(link(web.path("q", queue, msg_id, "log", f), f) for f in files)
    tail_url = web.path("q", queue, msg_id, "tail.json")
    job = web.store(queue).msg_dir(state, msg_id) / "job"
    empty = all(_size(job / f) == 0 for f in files)
    said = msgpage.no_output(state, files, empty)
    if said and state in msgpage.ENDED:
        return "<h2>Output</h2>" + said  # not an empty box
    return ("<h2>Output</h2>" + (f"<p>{listing}</p>" if listing else said)
            + '<p class="tailstate" id="tail-state" role="status" aria-live="polite">'
            "loading…</p>"
            '<p class="tailmore" id="tail-more" hidden><span></span> '
            '<button type="button">Load all</button></p>'
            f'<div class="tail" id="tail" data-url="{e(tail_url)}" '
            f'data-vendor="{e(web.path("static", "vendor"))}" data-initial="{e(state)}" '
            'role="log" aria-label="the message\'s output"></div>')


def _size(path: Any) -> int:
    try:
        return int(path.stat().st_size)
    except OSError:
        return 0


# ---------------------------------------------------------------- new message form
def new_message_page(web: Web, req: falcon.Request, resp: falcon.Response, queue: str,
                     kept: dict[str, Any] | None = None, error: str = "") -> None:
    """The form (``kept``: what was typed, shown again with ``error`` beside
    the field it names, or above the form when it names none)."""
    web.existing(queue)
    form, warning = _load_form(web, queue)
    shown_default = form.get("default", "shown") != "hidden"
    wrong = _field_named(error)
    if error and not wrong:
        warning += f'<p class="error" id="form-error" role="alert">{e(error)}</p>'
    inputs = "".join(_form_field(f, form.get(f"mesg_{f}"), shown_default, kept,
                                 error if f == wrong else "") for f in FORM_FIELDS)
    body = (f"<h1>New message for {e(queue)}</h1>" + warning
            + f'<form class="newmsg" method="post" '
              f'action="{e(web.path("q", queue, "new_message"))}">'
            + '<input type="hidden" name="x_format" value="html">' + inputs
            + '<div class="submit"><button class="primary" id="send">Send</button></div></form>')
    crumbs = [(web.queue_path(queue), queue), (web.path("q", queue, "new_message"), "new")]
    render(web, resp, f"New message for {queue}", crumbs, body)


def _load_form(web: Web, queue: str) -> tuple[dict[str, Any], str]:
    path = web.layout.queue_dir(queue) / "form.json"
    if not path.exists():
        return {}, ""
    try:
        return config.load_checked("form", path), ""
    except ConfigError as exc:
        return {}, f'<p class="error">form.json ignored: {e(exc)}</p>'


def _field_named(error: str) -> str:
    """The form field an error names (``mesg_due must be…``, ``due: …``), or ""."""
    found = re.search(r"\b(?:mesg_)?(" + "|".join(FORM_FIELDS) + r")\b", error)
    return found.group(1) if found else ""


def _form_field(field: str, spec: dict[str, Any] | None, shown_default: bool,
                kept: dict[str, Any] | None, error: str) -> str:
    name = f"mesg_{field}"
    if spec is None and not shown_default:
        return ""
    spec = spec or {}
    value = kept.get(name, "") if kept is not None else spec.get("value", "")
    if spec.get("hidden"):
        return f'<input type="hidden" name="{name}" value="{e(value)}">'
    kind, hint = FIELD_TYPES.get(field, ("text", ""))
    help_text = spec.get("help") or hint
    said = f'<div class="help" id="{name}-help">{e(help_text)}</div>' if help_text else ""
    wrong = (f'<div class="field-error" id="{name}-error">{e(error)}</div>'
             if error else "")
    described = " ".join(f"{name}-{part}" for part, on in (("help", said), ("error", wrong))
                         if on)
    attrs = (f' aria-describedby="{described}"' if described else "") + (
        ' aria-invalid="true"' if error else "")
    if kind == "checkbox":
        checked = " checked" if str(value).lower() in ("1", "true", "on", "yes") else ""
        control = f'<input type="checkbox" id="{name}" name="{name}" value="1"{checked}{attrs}>'
    else:
        step = {"number": ' step="any"', "datetime-local": ' step="1"'}.get(kind, "")
        control = (f'<input type="{kind}" id="{name}" name="{name}" value="{e(value)}"'
                   f"{step}{attrs}>")
    return (f'<label for="{name}">{e(spec.get("label", field))}</label>'
            f"{control}{wrong}{said}")
