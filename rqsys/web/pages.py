"""The HTML pages: dashboard, queue, message (with live tail) and new-message form."""

from __future__ import annotations

import json
from typing import Any

import falcon

from rqsys import config, timeline
from rqsys.errors import ConfigError, NotFound, RQError, StoreError
from rqsys.store import STATES
from rqsys.web import logs, pools, timeshtml
from rqsys.web.context import Web
from rqsys.web.html import badge, e, link, page, post_button, query, table

PAGE_SIZE = 25
FILTER_SCAN = 1000  # a text filter looks at this many newest messages of a state
FORM_FIELDS = ("dest", "src", "param1", "param2", "param3", "param4", "due", "max_count",
               "orig_msg_id", "force_remote", "priority", "timeout", "retry_max", "tags",
               "unique_key", "unique_for", "after", "after_policy")
ADMIN_BUTTONS = ("up", "pause", "down")


def _render(web: Web, resp: falcon.Response, title: str, crumbs: list[tuple[str, str]],
            body: str) -> None:
    trail = " / ".join(link(href, text) for href, text in crumbs)
    page(resp, web.prefix, str(web.sysconfig["host"]), title, trail, body)


# ---------------------------------------------------------------- dashboard
def dashboard(web: Web, req: falcon.Request, resp: falcon.Response) -> None:
    rows = [_dashboard_row(web, name) for name in web.layout.queue_names()]
    headers = ["Queue", "Admin", *STATES, "Status", "Actions"]
    body = "<h1>Queues</h1>" + (table(headers, rows, numeric=range(2, 2 + len(STATES))) if rows else
                                '<p class="muted">No queues yet.</p>')
    unreachable = sum(row[1] == badge("?") for row in rows)
    timers = f'<p>{link(web.path("timers"), "Timers")}</p>'
    _render(web, resp, "Queues", [], body + timers + pools.section(web)
            + _operational(unreachable))


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
                f'<span class="error">{e(exc)}</span>', ""]
    counts = [link(query(qpath, state=s), got["counts"].get(s, 0)) for s in STATES]
    new = link(web.path("q", name, "new_message"), "new message", "button")
    return [link(qpath, name), badge(got["admin"]), *counts, e(got["status"]),
            f'<div class="actions">{new}{_admin_buttons(web, name, web.path(""))}</div>']


def _admin_buttons(web: Web, name: str, back: str) -> str:
    action = web.path("q", name, "adminoper")
    return "".join(post_button(action, op, {op: "1", "back": back}, danger=op == "down")
                   for op in ADMIN_BUTTONS)


# ---------------------------------------------------------------- queue page
def queue_page(web: Web, req: falcon.Request, resp: falcon.Response, name: str) -> None:
    got = web.call(name, "counts")
    state = req.get_param("state") or "que"
    if state not in STATES:
        state = "que"
    offset = req.get_param_as_int("offset", min_value=0, default=0)
    text = req.get_param("filter") or ""
    tag = req.get_param("tag") or ""
    ids, total = _page_ids(web, name, state, offset, text, tag)
    new = link(web.path("q", name, "new_message"), "New message", "button primary")
    body = (f"<h1>Queue {e(name)} {badge(got['admin'])}</h1>"
            f'<p class="muted">{e(got["status"])}</p>'
            f'<div class="actions">{new}'
            f"{_admin_buttons(web, name, web.queue_path(name))}</div>"
            + _tabs(web, name, state, got["counts"]) + _filter_form(web, name, state, text, tag)
            + _message_table(web, name, state, ids)
            + _pager(web, name, state, offset, total, text, tag))
    _render(web, resp, f"Queue {name}", [(web.queue_path(name), name)], body)


def _page_ids(web: Web, name: str, state: str, offset: int, text: str,
              tag: str) -> tuple[list[str], int]:
    by_tag = {"tag": tag} if tag else {}
    if not text:
        got = web.call(name, "list", state=state, offset=offset, limit=PAGE_SIZE, **by_tag)
        return got["ids"], got["total"]
    ids = web.call(name, "list", state=state, offset=0, limit=FILTER_SCAN, **by_tag)["ids"]
    matching = [i for i in ids if text in i or text in json.dumps(_read(web, name, state, i))]
    return matching[offset:offset + PAGE_SIZE], len(matching)


def _read(web: Web, name: str, state: str, msg_id: str) -> dict[str, Any]:
    try:
        return web.store(name).read_msg(state, msg_id)
    except (NotFound, StoreError):
        return {}  # moved on since it was listed


def _tabs(web: Web, name: str, current: str, counts: dict[str, int]) -> str:
    tabs = [link(query(web.queue_path(name), state=s), f"{s} ({counts.get(s, 0)})",
                 "on" if s == current else "") for s in STATES]
    return f'<div class="tabs">{"".join(tabs)}</div>'


def _filter_form(web: Web, name: str, state: str, text: str, tag: str) -> str:
    return (f'<form class="filter" method="get" action="{e(web.queue_path(name))}">'
            f'<input type="hidden" name="state" value="{e(state)}">'
            f'<input type="text" name="filter" value="{e(text)}" placeholder="filter text">'
            f' <input type="text" name="tag" value="{e(tag)}" placeholder="tag">'
            " <button>Filter</button></form>")


def _message_table(web: Web, name: str, state: str, ids: list[str]) -> str:
    if not ids:
        return f'<p class="muted">No messages in {e(state)}.</p>'
    rows = []
    store = web.store(name)
    for msg_id in ids:
        msg = _read(web, name, state, msg_id)
        rows.append([link(web.msg_path(name, msg_id), msg_id), e(msg.get("param1", "")),
                     e(msg.get("param2", "")), e(msg.get("count", "")),
                     _tag_links(web, name, state, msg.get("tags") or []),
                     e(store.read_status(state, msg_id)),
                     *timeshtml.row_times(store.msg_dir(state, msg_id), msg)])
    return table(["Message", "param1", "param2", "count", "tags", "Status",
                  *timeshtml.TIME_COLUMNS], rows)


def _tag_links(web: Web, name: str, state: str, tags: list[str]) -> str:
    return " ".join(link(query(web.queue_path(name), state=state, tag=str(t)), t, "tag")
                    for t in tags)


def _pager(web: Web, name: str, state: str, offset: int, total: int, text: str,
           tag: str) -> str:
    base = web.queue_path(name)
    parts = [f'<span class="muted">{offset + 1 if total else 0}–'
             f"{min(offset + PAGE_SIZE, total)} of {total}</span>"]
    if offset > 0:
        parts.append(link(query(base, state=state, filter=text, tag=tag,
                                offset=max(0, offset - PAGE_SIZE)), "« newer"))
    if offset + PAGE_SIZE < total:
        parts.append(link(query(base, state=state, filter=text, tag=tag,
                                offset=offset + PAGE_SIZE), "older »"))
    return f'<div class="pager">{"".join(parts)}</div>'


# ---------------------------------------------------------------- message page
def message_page(web: Web, req: falcon.Request, resp: falcon.Response, queue: str,
                 msg: dict[str, Any]) -> None:
    msg_id, state = msg["msg_id"], msg["state"]
    fields = [[e(k), f"<code>{e(json.dumps(v))}</code>"] for k, v in sorted(msg.items())
              if k not in ("_attachments", "status", "status_text", "state", "_timeline",
                           *timeline.TIME_FIELDS)]
    body = (f'<h1>Message <span class="mono">{e(msg_id)}</span> '
            f'<span id="msg-state" class="badge {e(state)}">{e(state)}</span></h1>'
            f'<p>Status: <span class="mono" id="msg-status">{e(msg.get("status", ""))}</span></p>'
            + _after_line(msg)
            + _message_actions(web, queue, msg_id, state)
            + "<h2>Fields</h2>" + table(["Field", "Value"], fields) + timeshtml.section(msg)
            + _attachments(web, queue, msg_id, msg["_attachments"])
            + _logs(web, queue, msg_id, state))
    crumbs = [(web.queue_path(queue), queue), (web.msg_path(queue, msg_id), msg_id)]
    _render(web, resp, f"Message {msg_id}", crumbs, body)


def _after_line(msg: dict[str, Any]) -> str:
    """The messages this one runs after (its ``after``), linked."""
    after = msg.get("after") or []
    links = ", ".join(f'<a class="mono" href="{e(url)}">{e(url)}</a>' for url in after)
    return f'<p id="msg-after">After: {links}</p>' if after else ""


def _message_actions(web: Web, queue: str, msg_id: str, state: str) -> str:
    here, mpath = web.msg_path(queue, msg_id), web.msg_path(queue, msg_id)
    buttons = []
    if state == "prep":
        buttons.append(post_button(mpath, "commit", {"_method": "commit", "back": here}))
    if state == "que":
        buttons.append(post_button(mpath + "/run_now", "run now", {"back": here}))
    buttons.append(post_button(mpath + "/clone", "clone", {"x_format": "html"}))
    if state != "run":
        buttons.append(post_button(mpath, "delete", {"_method": "delete",
                                                     "back": web.queue_path(queue)},
                                   danger=True, confirm="Delete this message?"))
    buttons.append(post_button(mpath, "destroy", {"_method": "destroy",
                                                  "back": web.queue_path(queue)},
                               danger=True, confirm="Destroy this message (kills its script)?"))
    return f'<div class="actions">{"".join(buttons)}</div>'


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
    return (f"<h2>Output</h2><p>{listing or '<span class=muted>no log files yet</span>'}</p>"
            f'<p class="tailstate" id="tail-state">loading…</p>'
            f'<pre class="tail" id="tail" data-url="{e(tail_url)}" '
            f'data-initial="{e(state)}"></pre>')


# ---------------------------------------------------------------- new message form
def new_message_page(web: Web, req: falcon.Request, resp: falcon.Response, queue: str) -> None:
    if not web.layout.queue_dir(queue).is_dir():
        raise NotFound(f"no queue named {queue}")
    form, warning = _load_form(web, queue)
    shown_default = form.get("default", "shown") != "hidden"
    inputs = "".join(_form_field(f, form.get(f"mesg_{f}"), shown_default) for f in FORM_FIELDS)
    body = (f"<h1>New message for {e(queue)}</h1>" + warning
            + f'<form class="newmsg" method="post" '
              f'action="{e(web.path("q", queue, "new_message"))}">'
            + '<input type="hidden" name="x_format" value="html">' + inputs
            + '<div class="submit"><button class="primary" id="send">Send</button></div></form>')
    crumbs = [(web.queue_path(queue), queue), (web.path("q", queue, "new_message"), "new")]
    _render(web, resp, f"New message for {queue}", crumbs, body)


def _load_form(web: Web, queue: str) -> tuple[dict[str, Any], str]:
    path = web.layout.queue_dir(queue) / "form.json"
    if not path.exists():
        return {}, ""
    try:
        return config.load_checked("form", path), ""
    except ConfigError as exc:
        return {}, f'<p class="error">form.json ignored: {e(exc)}</p>'


def _form_field(field: str, spec: dict[str, Any] | None, shown_default: bool) -> str:
    name = f"mesg_{field}"
    if spec is None and not shown_default:
        return ""
    spec = spec or {}
    value = e(spec.get("value", ""))
    if spec.get("hidden"):
        return f'<input type="hidden" name="{name}" value="{value}">'
    help_text = f'<div class="help">{e(spec["help"])}</div>' if spec.get("help") else ""
    return (f'<label for="{name}">{e(spec.get("label", field))}</label>'
            f'<input type="text" id="{name}" name="{name}" value="{value}">{help_text}')
