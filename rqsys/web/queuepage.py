"""The queue page's listing: state tabs, a search (text, tag, time range, sort)
answered from the daemon's search index, the messages with their times, and
the chosen-rows and all-matching actions (one ``bulk`` request each)."""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.errors import BadRequest, NotFound, RQError, StoreError
from rqsys.observe import lastlines
from rqsys.run import protocol
from rqsys.search import query as searchquery
from rqsys.store import STATES, QueueView
from rqsys.web import msgpage, timeshtml
from rqsys.web.context import Web
from rqsys.web.html import pager, query

PAGE_SIZE = 25
FIRST_TABS = ("que", "run", "err", "prep", "done", "relayed")  # a page opens on the first not empty
SORTABLE = {"Created": "created", "Started": "started", "Ended": "ended", "Waited": "wait_s",
            "Ran": "run_s"}
FIELDS = ("text", "tag", "since", "until", "when", "sort", "desc")
FILTERS = ("text", "tag", "since", "until", "when")  # what a bulk action keeps of a search


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


def context(web: Web, req: falcon.Request, name: str, counts: dict[str, int]) -> dict[str, Any]:
    """What ``queue.html`` shows below the queue's title: the search form, the tabs
    (counting the matches when searching), the listing and its actions."""
    state = choose_state(req.get_param("state"), counts)
    fields = search_fields(req)
    offset = req.get_param_as_int("offset", min_value=0, default=0)
    searching = any(fields[f] for f in FIELDS if f not in ("sort", "desc"))
    try:
        listing, matched = _listing(web, name, state, fields, offset)
    except BadRequest as exc:
        listing, matched = {"error": str(exc), "search_error": True}, None
    shown = matched if searching and matched else counts
    tabs = [{"state": s, "count": shown.get(s, 0), "on": s == state,
             "href": query(web.queue_path(name), state=s, **fields)} for s in STATES]
    return {"state": state, "fields": fields, "flash": req.get_param("done") or "",
            "tabs": tabs, "listing": listing, "bulk_href": web.path("q", name, "bulk"),
            "others": [q for q in web.layout.queue_names() if q != name]}


def _listing(web: Web, name: str, state: str, fields: dict[str, str],
             offset: int) -> tuple[dict[str, Any], dict[str, int] | None]:
    """The listing, and how many match in each state (None: not a search)."""
    if state in ("que", "run") and not any(fields[f] for f in FIELDS):
        return _plain_listing(web, name, state, offset), None  # que in run order; run: live
    args = searchquery.from_params(lambda f: fields.get(f) or None)
    searching = any(fields[f] for f in FIELDS if f not in ("sort", "desc"))
    args.update(state=state, offset=offset, limit=PAGE_SIZE, by_state=searching)
    try:
        got = web.call(name, "search", **args)
    except BadRequest:
        raise
    except RQError as exc:
        return {"error": f"search unavailable: {exc}"}, None
    store = web.store(name)
    rows = [_index_row(web, name, state, row) | {"why": why(store, state, row["id"])}
            for row in got["rows"]]
    return (_shaped(web, name, state, fields, rows, offset, got["total"], got["more"])
            | {"partial": got.get("partial", False)}), got.get("states")


def _shaped(web: Web, name: str, state: str, fields: dict[str, str], rows: list[Any],
            offset: int, total: int, more: bool) -> dict[str, Any]:
    search = {f: fields[f] for f in FILTERS if fields[f]}
    back = query(web.queue_path(name), state=state, **search)
    count = f"{total:,}{'+' if more else ''}"
    hidden = {"state": state, **search, "back": back}
    bulk = ({"count": count, "fields": hidden, "retry": {"action": "retry", **hidden},
             "delete": {"action": "delete", **hidden}} if total and state != "run" else None)
    return {"rows": rows, "choosing": state != "run", "back": back, "bulk": bulk,
            "sorts": [_sort(web, name, state, fields, col) for col in timeshtml.TIME_COLUMNS],
            "pager": pager(web.queue_path(name), {"state": state, **fields}, offset, PAGE_SIZE,
                           total, more)}


def why(store: QueueView, state: str, msg_id: str) -> str:
    """A failed message's last line (its exception, say): what tells one failure
    from another where every status reads ``PROCESS EXITED IMPROPERLY``."""
    if state != "err":
        return ""
    lines = lastlines.read(store.msg_dir(state, msg_id))
    return lines[-1] if lines else ""


def _index_row(web: Web, name: str, state: str, row: dict[str, Any]) -> dict[str, Any]:
    times = {"created_at": row["created"], "started_at": row["started"],
             "ended_at": row["ended"], "wait_s": row["wait_s"], "run_s": row["run_s"]}
    return {"id": row["id"], "href": web.msg_path(name, row["id"]), "params": row["params"],
            "tags": _tags(web, name, state, row["tags"]), "status": row["status"],
            "times": timeshtml.time_cells(times)}


def _plain_listing(web: Web, name: str, state: str, offset: int) -> dict[str, Any]:
    got = web.call(name, "list", state=state, offset=offset, limit=PAGE_SIZE)
    store = web.store(name)
    rows = []
    for msg_id in got["ids"]:
        try:
            msg = store.read_msg(state, msg_id)
        except (NotFound, StoreError):
            continue  # moved on since it was listed
        status = store.read_status(state, msg_id)
        rows.append({"id": msg_id, "href": web.msg_path(name, msg_id),
                     "params": " ".join(str(msg[k]) for k in ("param1", "param2")
                                        if msg.get(k)),
                     "tags": _tags(web, name, state, msg.get("tags") or []), "status": status,
                     "why": why(store, state, msg_id),
                     "progress": msgpage.progress(protocol.progress(status))
                     if state == "run" else None,
                     "times": timeshtml.row_times(store.msg_dir(state, msg_id), msg)})
    return _shaped(web, name, state, dict.fromkeys(FIELDS, ""), rows, offset, got["total"],
                   False) | {"bulk": None}


def _sort(web: Web, name: str, state: str, fields: dict[str, str], column: str) -> dict[str, str]:
    key = SORTABLE[column]
    current = (fields["sort"] or "created") == key
    desc = "0" if current and fields["desc"] != "0" else ""
    arrow = (" ▲" if fields["desc"] == "0" else " ▼") if current else ""
    return {"label": column + arrow,
            "href": query(web.queue_path(name), state=state, **dict(fields, sort=key, desc=desc))}


def _tags(web: Web, name: str, state: str, tags: list[str]) -> list[dict[str, str]]:
    return [{"name": str(t), "href": query(web.queue_path(name), state=state, tag=str(t))}
            for t in tags]
