"""Queue routes: the queue list, one queue's summary and config, creating messages,
admin operations and (when allowed) new queues."""

from __future__ import annotations

import os
import signal
from typing import Any

import falcon

from rqsys import config
from rqsys.errors import BadRequest, RQError
from rqsys.store import check_queue_name
from rqsys.web import body, pages
from rqsys.web.answers import Forbidden, ok
from rqsys.web.context import Web, split_suffix

ADMIN_OPERS = ("up", "down", "pause", "resume")
CREATE_METHODS: dict[str, dict[str, Any]] = {
    "commit": {}, "prep": {"state": "prep"}, "single_que": {"single": True}}
MAX_DONE_LIMIT = 1000


def queue_summary(web: Web, name: str) -> dict[str, Any]:
    """Counts per state, admin state and status line (from the daemon: O(1))."""
    got = web.call(name, "counts")
    return {"name": name, "url": config.base_url(web.sysconfig) + f"q/{name}",
            "admin_state": got["admin"], "status": got["status"],
            "num_workers": got["num_workers"], "counts": got["counts"]}


class QueueList:
    def __init__(self, web: Web) -> None:
        self.web = web

    def on_get_json(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.web.layout.queue_names()

    def on_get_txt(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_TEXT
        resp.text = "".join(f"{name}\n" for name in self.web.layout.queue_names())


class QueueResource:
    """``/q/<q>`` (HTML), ``/q/<q>.json`` and ``/q/<q>.txt``."""

    def __init__(self, web: Web) -> None:
        self.web = web

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        name, suffix = split_suffix(name)
        check_queue_name(name)
        if suffix == ".json":
            resp.media = queue_summary(self.web, name)
        elif suffix == ".txt":
            resp.content_type = falcon.MEDIA_TEXT
            resp.text = _summary_text(queue_summary(self.web, name))
        else:
            pages.queue_page(self.web, req, resp, name)


def _summary_text(summary: dict[str, Any]) -> str:
    lines = [f"{key}: {summary[key]}" for key in ("name", "admin_state", "status",
                                                   "num_workers")]
    lines += [f"{state}: {n}" for state, n in summary["counts"].items()]
    return "\n".join(lines) + "\n"


class QueueConfig:
    def __init__(self, web: Web) -> None:
        self.web = web

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        resp.media = self.web.call(name, "config")["config"]


class DoneList:
    """``/q/<q>/done.json?limit=N``: the newest done message ids."""

    def __init__(self, web: Web) -> None:
        self.web = web

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        limit = _int_param(req.get_param("limit"), "limit", default=10)
        if not 0 <= limit <= MAX_DONE_LIMIT:
            raise BadRequest(f"limit must be between 0 and {MAX_DONE_LIMIT}")
        resp.media = self.web.call(name, "list", state="done", limit=limit)["ids"]


def _int_param(value: str | None, name: str, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise BadRequest(f"{name} must be an integer, not {value[:40]!r}") from exc


class NewMessage:
    """``POST /q/<q>/new_message`` (``mesg`` JSON or ``mesg_*`` fields); GET: the form."""

    def __init__(self, web: Web) -> None:
        self.web = web

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        pages.new_message_page(self.web, req, resp, check_queue_name(name))

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        check_queue_name(name)
        params = body.read_params(req)
        method = params.get("_method") or "commit"
        if method not in CREATE_METHODS:
            raise BadRequest(f"_method must be commit, prep or single_que, not {method!r:.40}")
        msg = body.message_from(params)
        got = self.web.call(name, "create", msg=msg, **CREATE_METHODS[method])
        ok(req, resp, self.web.msg_url(name, got["msg_id"]), params,
           page=self.web.msg_path(name, got["msg_id"]))


class AdminOper:
    """``POST /q/<q>/adminoper``: a field named up, down, pause or resume (or oper=)."""

    def __init__(self, web: Web) -> None:
        self.web = web

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        check_queue_name(name)
        params = body.read_params(req)
        opers = [op for op in ADMIN_OPERS if op in params]
        if params.get("oper") in ADMIN_OPERS:
            opers.append(params["oper"])
        if len(set(opers)) != 1:
            raise BadRequest("name exactly one of up, down, pause, resume")
        got = self.web.call(name, "adminoper", oper=opers[0])
        ok(req, resp, got["admin"], params)


class NewQueue:
    """``POST /new_queue`` (name, script, num_workers) when ``allow_new_queue`` is set."""

    def __init__(self, web: Web) -> None:
        self.web = web

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self.web.sysconfig.get("allow_new_queue"):
            raise Forbidden("new queues are not allowed here (allow_new_queue is false)")
        params = body.read_params(req)
        name = check_queue_name(str(params.get("name", "")))
        if name in self.web.layout.queue_names():
            raise BadRequest(f"queue {name} already exists")
        overlay = {"num_workers": _int_param(params.get("num_workers"), "num_workers", 1)}
        cfg = config.queue_config(name, _script(params), overlay, source="new_queue")
        self.web.layout.create_queue_dir(name, cfg)
        _tell_supervisor()
        ok(req, resp, config.base_url(self.web.sysconfig) + f"q/{name}", params)


def _script(params: dict[str, Any]) -> str:
    script = str(params.get("script", ""))
    if not os.path.isabs(script) or not os.access(script, os.X_OK):
        raise BadRequest(f"script must be an absolute path to an executable: {script[:200]!r}")
    return script


def _tell_supervisor() -> None:
    """In embedded mode the supervisor starts daemons for new queues on SIGHUP."""
    pid = os.environ.get("RQ_SUPERVISOR_PID", "")
    if pid.isdigit():
        try:
            os.kill(int(pid), signal.SIGHUP)
        except OSError as exc:
            raise RQError(f"queue created, but the supervisor was not told: {exc}") from exc
