"""A message's page (template ``message.html``): the actions that can apply to it
now, how far along it is, why it failed, its times, timeline and runs, its
fields and attachments, and its output (a terminal while it runs)."""

from __future__ import annotations

import json
from typing import Any

import falcon

from rqsys.observe import timeline, tracing
from rqsys.web import access, logs, timeshtml
from rqsys.web.context import Web
from rqsys.web.html import query, render

ENDED = ("done", "err", "relayed")
NOT_FIELDS = ("_attachments", "status", "status_text", "state", "_timeline", "progress",
              "last_lines", "trace_id", *timeline.TIME_FIELDS)  # shown elsewhere on the page


def message_page(web: Web, req: falcon.Request, resp: falcon.Response, queue: str,
                 msg: dict[str, Any]) -> None:
    msg_id, state = msg["msg_id"], msg["state"]
    crumbs = [(web.queue_path(queue), queue), (web.msg_path(queue, msg_id), msg_id)]
    acts = access.account(req).may("operator", queue)  # else its buttons are not shown
    render(web, resp, "message.html", f"Message {msg_id}", crumbs, msg_id=msg_id, state=state,
           status=msg.get("status", ""), progress=progress(msg.get("progress")),
           trace=trace_of(web, msg),
           after=[(url, str(url).startswith(("http://", "https://")))
                  for url in msg.get("after") or []],
           actions=actions(web, queue, msg_id, state) if acts else [],
           why=why_failed(web, queue, msg), msg_times=timeshtml.time_cells(msg),
           timeline=timeshtml.events(msg.get("_timeline") or []),
           runs=runs(msg.get("_timeline") or []),
           fields=[(k, json.dumps(v)) for k, v in sorted(msg.items()) if k not in NOT_FIELDS],
           attachments=_attachments(web, queue, msg_id, msg["_attachments"]),
           out=_output(web, queue, msg_id, state),
           attach_action=query(web.path("q", queue, msg_id, "attach", "new"),
                               back=web.msg_path(queue, msg_id))
           if state == "prep" and acts else "")


def trace_of(web: Web, msg: dict[str, Any]) -> dict[str, str] | None:
    """The message's trace id, and its link when ``tracing.link`` is configured."""
    found = tracing.trace_id(str(msg.get(tracing.FIELD) or ""))
    if not found:
        return None
    link = str((web.sysconfig.get("tracing") or {}).get("link") or "")
    return {"id": found, "href": link.replace("{trace_id}", found)}


def actions(web: Web, queue: str, msg_id: str, state: str) -> list[dict[str, Any]]:
    """Only what the daemon would do for a message in ``state``."""
    here = mpath = web.msg_path(queue, msg_id)
    back = web.queue_path(queue)

    def button(action: str, label: str, fields: dict[str, str], danger: bool = False,
               confirm: str = "") -> dict[str, Any]:
        return {"action": action, "label": label, "fields": fields, "danger": danger,
                "confirm": confirm}
    buttons = []
    if state == "prep":
        buttons.append(button(mpath, "commit", {"_method": "commit", "back": here}))
    if state == "err":  # runs again as it was, in place (same id)
        buttons.append(button(mpath, "retry", {"_method": "retry", "back": here}))
    if state == "que":
        buttons.append(button(mpath + "/run_now", "run now", {"back": here}))
    buttons.append(button(mpath + "/clone", "clone", {"x_format": "html"}))
    if state in ("que", "run"):  # to err, with a record (retried like any err)
        buttons.append(button(mpath, "cancel", {"_method": "cancel", "back": here}, True,
                              "Cancel this message (it goes to err)?"))
    if state == "run":
        buttons.append(button(mpath, "destroy", {"_method": "destroy", "back": back}, True,
                              "Destroy this message (kills its script)?"))
    else:
        buttons.append(button(mpath, "delete", {"_method": "delete", "back": back}, True,
                              "Delete this message?"))
    return buttons


def progress(said: dict[str, Any] | None) -> dict[str, Any] | None:
    """How far along a running message says it is (its ``N%`` or ``N/M`` status)."""
    if not said:
        return None
    fraction = float(said["fraction"])
    text = (f"{said['done']:,}/{said['total']:,}" if "total" in said
            else f"{fraction * 100:.0f}%")
    return {"value": f"{fraction:g}", "said": text}


def why_failed(web: Web, queue: str, msg: dict[str, Any]) -> dict[str, Any] | None:
    """The err panel: RQ's status text and the last lines the run wrote."""
    if msg["state"] != "err":
        return None
    return {"status": msg.get("status_text", ""), "lines": msg.get("last_lines") or [],
            "log": web.path("q", queue, msg["msg_id"], "log", "stdio.log")}


RUN_ENDS = ("done", "err", "relayed", "retry", "resend")  # what became of a run


def runs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run, every attempt kept: when, where, how it ended and what
    it used (``wait4``), what became of it and, when it failed, its last lines."""
    found: list[dict[str, Any]] = []
    for item in events:
        ev = item.get("ev")
        if ev == "started":
            found.append({"start": item})
        elif ev == "exit" and found and "exit" not in found[-1]:
            found[-1]["exit"] = item
        elif ev in RUN_ENDS and found and "end" not in found[-1]:
            found[-1]["end"] = item
    return [_run(n, row) for n, row in enumerate(found, 1)]


def _run(n: int, row: dict[str, Any]) -> dict[str, Any]:
    start, end, became = row["start"], row.get("exit", {}), row.get("end", {})
    if "signal" in end:
        how = f"signal {end['signal']}"
    elif "exit_status" in end:
        how = f"exit {end['exit_status']}"
    else:
        how = "running" if not end else "?"
    rss = end.get("maxrss_kb")
    return {"run": n, "started": timeshtml.when(start.get("t")),
            "where": f"{start.get('host', '')} / {start.get('pid', start.get('handed', ''))}",
            "how": how, "ran": timeshtml.seconds(end.get("run_s")),
            "user": timeshtml.seconds(end.get("utime_s")),
            "system": timeshtml.seconds(end.get("stime_s")),
            "rss": f"{rss / 1024:.1f} MiB" if isinstance(rss, int | float) else "",
            "ended": timeshtml.when(became.get("t")) if became else "",
            "became": f"{became['ev']}: {became.get('text', '')}" if became else "",
            "lines": [str(line) for line in became.get("last_lines") or []]}


def _attachments(web: Web, queue: str, msg_id: str,
                 found: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": name, "href": web.path("q", queue, msg_id, "attach", name),
             "size": info["size"], "md5": info["md5"]} for name, info in sorted(found.items())]


def _output(web: Web, queue: str, msg_id: str, state: str) -> dict[str, Any]:
    files = logs.job_files(web, queue, state, msg_id)
    job = web.store(queue).msg_dir(state, msg_id) / "job"
    empty = all(_size(job / f) == 0 for f in files)
    return {"files": [{"name": f, "href": web.path("q", queue, msg_id, "log", f)}
                      for f in files],
            "said": no_output(state, files, empty), "ended": state in ENDED,
            "tail_url": web.path("q", queue, msg_id, "tail.json"),
            "vendor": web.path("static", "vendor")}


def no_output(state: str, files: list[str], empty: bool) -> str:
    """What the Output section says instead of an empty box ("" when there is output)."""
    if state in ENDED and (not files or empty):
        return "No output: the script wrote nothing."
    if state in ("que", "prep") and not files:
        return "No output yet: it has not run."
    return ""


def _size(path: Any) -> int:
    try:
        return int(path.stat().st_size)
    except OSError:
        return 0
