"""The queue page: state tabs, a search (text, tag, time range, sort) answered
from the daemon's search index, the messages with their times, and the
select-all-matching actions (one ``bulk`` request)."""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.errors import BadRequest, NotFound, RQError, StoreError
from rqsys.search import query as searchquery
from rqsys.store import STATES
from rqsys.web import timeshtml
from rqsys.web.context import Web
from rqsys.web.html import e, link, post_button, query, table

PAGE_SIZE = 25
FIRST_TABS = ("que", "run", "err", "prep", "done", "relayed")  # a page opens on the first not empty
SORTABLE = {"Created": "created", "Started": "started", "Ended": "ended", "Waited": "wait_s",
            "Ran": "run_s"}
FIELDS = ("text", "tag", "since", "until", "when", "sort", "desc")


def choose_state(asked: str | None, counts: dict[str, int]) -> str:
    """The tab asked for, else the first one holding messages (que if none do)."""
    if asked in STATES:
        return asked
    return next((s for s in FIRST_TABS if counts.get(s)), "que")


def search_fields(req: falcon.Request) -> dict[str, str]:
    """The search as typed (RQ's older ``filter`` is the text)."""
    fields = {f: req.get_param(f) or "" for f in FIELDS}
    fields["text"] = fields["text"] or req.get_param("filter") or ""
    return fields


def body(web: Web, req: falcon.Request, name: str, counts: dict[str, int]) -> str:
    """Tabs, search form, results and bulk actions (the live part refreshed by rq.js)."""
    state = choose_state(req.get_param("state"), counts)
    fields = search_fields(req)
    offset = req.get_param_as_int("offset", min_value=0, default=0)
    done = req.get_param("done")
    flash = f'<p class="flash" id="bulk-done">{e(done)}</p>' if done else ""
    searching = any(fields[f] for f in FIELDS if f not in ("sort", "desc"))
    try:
        listing, matched = _listing(web, name, state, fields, offset)
    except BadRequest as exc:
        listing, matched = f'<p class="error" id="search-error">{e(exc)}</p>', None
    live = ('<div id="live-queue" class="live" data-refresh="5">'
            + _tabs(web, name, state, matched if searching and matched else counts, fields)
            + listing + "</div>")
    return flash + _search_form(web, name, state, fields) + live


def _listing(web: Web, name: str, state: str, fields: dict[str, str],
             offset: int) -> tuple[str, dict[str, int] | None]:
    """The listing's HTML, and how many match in each state (None: not a search)."""
    if state in ("que", "run") and not any(fields[f] for f in FIELDS):
        return _plain_listing(web, name, state, offset), None  # que in run order; run: live
    args = searchquery.from_params(lambda f: fields.get(f) or None)
    args.update(state=state, offset=offset, limit=PAGE_SIZE, by_state=True)
    try:
        got = web.call(name, "search", **args)
    except BadRequest:
        raise
    except RQError as exc:
        return f'<p class="error">search unavailable: {e(exc)}</p>', None
    note = ('<p class="muted">The search index is being rebuilt: some messages may be '
            "missing.</p>") if got.get("partial") else ""
    rows = [_index_row(web, name, state, row) for row in got["rows"]]
    return (note + _table(web, name, state, fields, rows)
            + _pager(web, name, state, fields, offset, got["total"], got["more"])
            + _bulk(web, name, state, fields, got["total"], got["more"])), got["states"]


def _index_row(web: Web, name: str, state: str, row: dict[str, Any]) -> list[str]:
    times = {"created_at": row["created"], "started_at": row["started"],
             "ended_at": row["ended"], "wait_s": row["wait_s"], "run_s": row["run_s"]}
    return [*_pick(state, row["id"]), link(web.msg_path(name, row["id"]), row["id"]),
            e(row["params"]),
            _tag_links(web, name, state, row["tags"]), e(row["status"]),
            *timeshtml.time_cells(times)]


def _plain_listing(web: Web, name: str, state: str, offset: int) -> str:
    got = web.call(name, "list", state=state, offset=offset, limit=PAGE_SIZE)
    store = web.store(name)
    rows = []
    for msg_id in got["ids"]:
        try:
            msg = store.read_msg(state, msg_id)
        except (NotFound, StoreError):
            continue  # moved on since it was listed
        params = " ".join(str(msg[k]) for k in ("param1", "param2") if msg.get(k))
        rows.append([*_pick(state, msg_id), link(web.msg_path(name, msg_id), msg_id), e(params),
                     _tag_links(web, name, state, msg.get("tags") or []),
                     e(store.read_status(state, msg_id)),
                     *timeshtml.row_times(store.msg_dir(state, msg_id), msg)])
    fields = dict.fromkeys(FIELDS, "")
    return (_table(web, name, state, fields, rows)
            + _pager(web, name, state, fields, offset, got["total"], False))


def _table(web: Web, name: str, state: str, fields: dict[str, str],
           rows: list[list[str]]) -> str:
    if not rows:
        return f'<p class="muted" id="no-messages">No messages in {e(state)} match.</p>'
    pick_all = ('<input type="checkbox" class="pick-all" aria-label="choose all on this page">'
                if state != "run" else "")
    heads = [*([pick_all] if pick_all else []), "Message", "Params", "Tags", "Status",
             *(_sort_link(web, name, state, fields, col) for col in timeshtml.TIME_COLUMNS)]
    return table(heads, rows) + (_chosen(web, name, state, fields) if pick_all else "")


def _pick(state: str, msg_id: str) -> list[str]:
    """A row's box for the chosen-rows actions (none for run: destroyed one at a time)."""
    if state == "run":
        return []
    return [f'<input type="checkbox" class="pick" name="id" value="{e(msg_id)}" form="chosen" '
            f'aria-label="choose {e(msg_id)}">']


def _chosen(web: Web, name: str, state: str, fields: dict[str, str]) -> str:
    """The actions on the rows ticked on this page (the boxes belong to this form)."""
    search = {f: fields[f] for f in FIELDS if fields[f]}
    hidden = "".join(f'<input type="hidden" name="{e(k)}" value="{e(v)}">' for k, v in
                     {"state": state, "back": query(web.queue_path(name), state=state,
                                                    **search)}.items())
    retry = ('<button name="action" value="retry">Retry chosen</button>'
             if state == "err" else "")
    return (f'<form id="chosen" class="actions chosen" method="post" '
            f'action="{e(web.path("q", name, "bulk"))}">{hidden}{retry}'
            '<button name="action" value="delete" class="danger">Delete chosen</button>'
            + _queue_select(web, name, "dest-chosen", "Move chosen to")
            + "</form>")


def _sort_link(web: Web, name: str, state: str, fields: dict[str, str], column: str) -> str:
    key = SORTABLE[column]
    current = (fields["sort"] or "created") == key
    desc = "0" if current and fields["desc"] != "0" else ""
    arrow = (" ▲" if fields["desc"] == "0" else " ▼") if current else ""
    href = query(web.queue_path(name), state=state, **dict(fields, sort=key, desc=desc))
    return f'<a href="{e(href)}" class="sort">{e(column + arrow)}</a>'


def _tabs(web: Web, name: str, current: str, counts: dict[str, int],
          fields: dict[str, str]) -> str:
    tabs = [link(query(web.queue_path(name), state=s, **fields), f"{s} ({counts.get(s, 0)})",
                 "on" if s == current else "") for s in STATES]
    return f'<div class="tabs" id="tabs">{"".join(tabs)}</div>'


def _search_form(web: Web, name: str, state: str, fields: dict[str, str]) -> str:
    def box(field: str, hint: str, size: str = "") -> str:
        return (f'<input type="text" name="{field}" value="{e(fields[field])}" '
                f'placeholder="{e(hint)}" aria-label="{e(hint)}" class="{size}">')

    def select(field: str, options: tuple[str, ...], label: str) -> str:
        opts = "".join(f'<option value="{o}"{" selected" if fields[field] == o else ""}>'
                       f"{e(o or label)}</option>" for o in options)
        return f'<select name="{field}" aria-label="{e(label)}">{opts}</select>'
    return (f'<form class="filter search" method="get" action="{e(web.queue_path(name))}">'
            f'<input type="hidden" name="state" value="{e(state)}">'
            + box("text", "search params, status, tags") + box("tag", "tag", "short")
            + box("since", "since (2h, 3d, 2026-11-24)", "short")
            + box("until", "until", "short")
            + select("when", ("", "started", "ended"), "created")
            + select("sort", ("", "started", "ended", "wait_s", "run_s"), "newest")
            + ' <button class="primary" id="search">Search</button></form>')


def _tag_links(web: Web, name: str, state: str, tags: list[str]) -> str:
    return " ".join(link(query(web.queue_path(name), state=state, tag=str(t)), t, "tag")
                    for t in tags)


def _pager(web: Web, name: str, state: str, fields: dict[str, str], offset: int,
           total: int, more: bool) -> str:
    base = web.queue_path(name)
    shown = f"{total:,}+" if more else f"{total:,}"
    parts = [f'<span class="muted" id="match-count">{offset + 1 if total else 0}–'
             f"{min(offset + PAGE_SIZE, total)} of {shown}</span>"]
    if offset > 0:
        parts.append(link(query(base, state=state, **fields,
                                offset=max(0, offset - PAGE_SIZE)), "« previous"))
    if offset + PAGE_SIZE < total:
        parts.append(link(query(base, state=state, **fields, offset=offset + PAGE_SIZE),
                          "next »"))
    return f'<div class="pager">{"".join(parts)}</div>'


def _bulk(web: Web, name: str, state: str, fields: dict[str, str], total: int,
          more: bool) -> str:
    """Select all matching → retry (err) / delete: one request, the daemon does it in steps."""
    if not total or state == "run":
        return ""
    search = {f: fields[f] for f in ("text", "tag", "since", "until", "when") if fields[f]}
    back = query(web.queue_path(name), state=state, **search)
    hidden = {"state": state, **search, "back": back}
    action = web.path("q", name, "bulk")
    count = f"{total:,}{'+' if more else ''}"
    buttons = []
    if state == "err":
        buttons.append(post_button(action, f"Retry all {count} matching",
                                   {"action": "retry", **hidden}))
    buttons.append(post_button(action, f"Delete all {count} matching",
                               {"action": "delete", **hidden}, danger=True,
                               confirm=f"Delete all {count} matching messages?"))
    buttons.append(_move_form(web, name, action, count, hidden))
    return f'<div class="actions bulk" id="bulk">{"".join(buttons)}</div>'


def _move_form(web: Web, name: str, action: str, count: str, hidden: dict[str, str]) -> str:
    """Move all matching to another queue (a select of the others)."""
    select = _queue_select(web, name, "dest-all", f"Move all {count} matching to", "move")
    if not select:
        return ""
    fields = "".join(f'<input type="hidden" name="{e(k)}" value="{e(v)}">'
                     for k, v in hidden.items())
    return f'<form method="post" action="{e(action)}" class="move">{fields}{select}</form>'


def _queue_select(web: Web, name: str, ident: str, label: str, button_id: str = "") -> str:
    """A move button and the other queues to choose from (none chosen until the
    user picks one: the first by name is no default); "" when there is none."""
    others = [q for q in web.layout.queue_names() if q != name]
    if not others:
        return ""
    options = "".join(f'<option value="{e(q)}">{e(q)}</option>' for q in others)
    button = f' id="{button_id}"' if button_id else ""
    return (f'<button name="action" value="move"{button}>{e(label)}</button> '
            f'<select name="dest" id="{ident}" required aria-label="queue to move to">'
            f'<option value="">choose a queue…</option>{options}</select>')
