"""Queue routes: the queue list, one queue's summary and config, creating messages,
admin operations and (when allowed) new queues."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import falcon

from rqsys import config
from rqsys.errors import BadRequest, Forbidden, RQError, SpawnError, TooLarge, Unavailable
from rqsys.message import split_method
from rqsys.observe import tracing
from rqsys.run.spawn import script_argv
from rqsys.store import ADMIN_OPERS, QUEUE_NAME_RE, STATES, check_queue_name
from rqsys.web import access, body, newform, pages
from rqsys.web.answers import ok, status_for
from rqsys.web.context import Resource, Web, split_suffix

CREATE_METHODS: dict[str, dict[str, Any]] = {
    "commit": {}, "prep": {"state": "prep"}, "single_que": {"single": True}}
MAX_DONE_LIMIT = 1000
DUPLICATE_HEADER = "RQ-Duplicate"  # "true": a unique key was held; the URL is the holder's


def queue_summary(web: Web, name: str) -> dict[str, Any]:
    """RQ's ``/q/<q>.json``: status, uptime and ``<state>_size`` counts (a DOWN
    queue: status only), with rqsys's own fields beside them.  Counts come
    from the daemon (O(1)); a daemon that cannot be reached is DOWN, as in RQ."""
    try:
        got = web.call(name, "counts")
    except Unavailable as exc:
        return {"status": "DOWN", "name": name, "error": str(exc)}
    status = rq_status(got)
    summary: dict[str, Any] = {"status": status}
    if status != "DOWN":
        summary["uptime"] = _uptime(web, name, got)
        summary.update({f"{s}_size": got["counts"].get(s, 0) for s in STATES})
    summary.update(name=name, url=config.base_url(web.sysconfig) + f"q/{name}",
                   admin_state=got["admin"], status_line=got["status"],
                   num_workers=got["num_workers"], counts=got["counts"])
    return summary


def rq_status(got: dict[str, Any]) -> str:
    """RQ's combined status: the oper status (SCRIPTERROR) over the admin one."""
    if got.get("oper") not in (None, "UP"):
        return str(got["oper"])
    if str(got.get("status", "")).startswith("SCRIPTERROR"):
        return "SCRIPTERROR"
    return str(got["admin"])


def _uptime(web: Web, name: str, got: dict[str, Any]) -> int:
    """Seconds the queue daemon has run (from its answer, else from /proc)."""
    if "uptime" in got:
        return int(got["uptime"])
    return process_age(int(web.call(name, "ping")["pid"]))


def process_age(pid: int) -> int:
    """Seconds since ``pid`` started (0 when /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        with open("/proc/uptime") as up:
            since_boot = float(up.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat(5)
    return max(0, int(since_boot - started))


class QueueList(Resource):
    """``/q.json`` and ``/q.txt``: the queues the user sees."""

    def on_get_json(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = seen(self.web, req)

    def on_get_txt(self, req: falcon.Request, resp: falcon.Response) -> None:
        """RQ's list: one ``q/<name>.txt`` line per queue (what check_rq follows)."""
        resp.content_type = falcon.MEDIA_TEXT
        resp.text = "".join(f"q/{name}.txt\n" for name in seen(self.web, req))


def seen(web: Web, req: falcon.Request) -> list[str]:
    """The queues the request's user sees (every one, but for a user of some)."""
    user = access.account(req)
    return [name for name in web.layout.queue_names() if user.sees(name)]


class QueueResource(Resource):
    """``/q/<q>`` (HTML), ``/q/<q>.json`` and ``/q/<q>.txt``."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        name, suffix = split_suffix(name)
        self.web.existing(name)
        if suffix == ".json":
            resp.media = queue_summary(self.web, name)
        elif suffix == ".txt":
            resp.content_type = falcon.MEDIA_TEXT
            resp.text = summary_text(queue_summary(self.web, name))
        else:
            pages.queue_page(self.web, req, resp, name)


def summary_text(summary: dict[str, Any]) -> str:
    """RQ's ``/q/<q>.txt`` lines (``status: UP``, ``uptime: N``, ``prep: N``, ...)."""
    lines = [f"status: {summary['status']}"]
    if "uptime" in summary:
        lines.append(f"uptime: {summary['uptime']}")
        lines += [f"{s}: {summary[f'{s}_size']}" for s in STATES]
        lines.append(f"num_workers: {summary['num_workers']}")
    return "\n".join(lines) + "\n"


class QueueConfig(Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        cfg = dict(self.web.call(name, "config")["config"])
        if isinstance(cfg.get("script"), str):
            cfg["script"] = shown_script(self.web, cfg["script"])
        resp.media = cfg


def shown_script(web: Web, script: str) -> str:
    """The script as an operator finds it, without the server's absolute path: relative
    to the root when under it (``scandir/q/run``), else its scandir entry and file name
    (``q/run``)."""
    path = Path(script)
    if not path.is_absolute():
        return script
    try:
        return str(path.relative_to(web.layout.root))
    except ValueError:
        return str(Path(path.parent.name, path.name))


class DoneList(Resource):
    """``/q/<q>/done.json?limit=N``: the newest done message ids."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        limit = _int_param(req.get_param("limit"), "limit", default=10)
        if not 0 <= limit <= MAX_DONE_LIMIT:
            raise BadRequest(f"limit must be between 0 and {MAX_DONE_LIMIT}")
        tag = {"tag": req.get_param("tag")} if req.get_param("tag") else {}
        resp.media = self.web.call(name, "list", state="done", limit=limit, **tag)["ids"]


def _int_param(value: str | None, name: str, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise BadRequest(f"{name} must be an integer, not {value[:40]!r}") from exc


class NewMessage(Resource):
    """``POST /q/<q>/new_message``: ``mesg`` JSON (RQ: ``_method`` inside it), RQ's
    ``mesg[field]`` form or our ``mesg_*`` fields; GET: the form."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        newform.new_message_page(self.web, req, resp, check_queue_name(name))

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        check_queue_name(name)
        pairs = body.read_pairs(req)
        params = dict(pairs)
        try:
            self._create(req, resp, name, params, pairs)
        except (BadRequest, TooLarge) as exc:
            if params.get("x_format") != "html":
                raise
            resp.status = status_for(exc)  # the form again, as typed, the error by its field
            newform.new_message_page(self.web, req, resp, name, params, str(exc))

    def _create(self, req: falcon.Request, resp: falcon.Response, name: str,
                params: dict[str, Any], pairs: body.Pairs) -> None:
        outer = str(params.get("_method") or "commit")  # rqsys < 0.2 sent it beside mesg
        msg, method = split_method(body.message_from(params, pairs), outer)
        if method not in CREATE_METHODS:
            raise BadRequest(f"_method must be commit, prep or single_que, not {method!r:.40}")
        parent = req.get_header(tracing.FIELD) or ""
        if isinstance(msg, dict) and tracing.trace_id(parent):  # W3C: a bad one is ignored
            msg.setdefault(tracing.FIELD, parent)
        got = self.web.act(req, name, "create", msg=msg, by=f"http {req.remote_addr}",
                            **CREATE_METHODS[method])
        if got.get("duplicate"):  # RQ's answer stays ["ok", url]: the flag is a header
            resp.set_header(DUPLICATE_HEADER, "true")
        ok(req, resp, self.web.msg_url(name, got["msg_id"]), params,
           page=self.web.msg_path(name, got["msg_id"]))


class AdminOper(Resource):
    """``POST /q/<q>/adminoper``: a field named up, down, pause or resume (or oper=)."""

    role = "admin"

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        check_queue_name(name)
        params = body.read_params(req)
        opers = [op for op in ADMIN_OPERS if op in params]
        if isinstance(params.get("oper"), str) and params["oper"] in ADMIN_OPERS:
            opers.append(params["oper"])
        if len(set(opers)) != 1:
            raise BadRequest("name exactly one of up, down, pause, resume")
        got = self.web.act(req, name, "adminoper", oper=opers[0])
        ok(req, resp, got["admin"], params)


class NewQueue(Resource):
    """``POST /new_queue`` when ``allow_new_queue`` is set: RQ's form (``queue[name]``,
    ``queue[script]``, ``queue[num_workers]``, ``queue[exec_prefix]``,
    ``queue[env_vars][K]``, ``queue[coalesce_params][]``, ...) or plain fields."""

    role = "admin"

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Make the queue; told to the web's audit trail, made or not."""
        try:
            name = self._make(req, resp)
        except RQError as exc:
            self._audit(req, "", "refused" if isinstance(exc, Forbidden) else "failed",
                        error=f"{type(exc).__name__}: {exc}")
            raise
        self._audit(req, name, "ok")

    def _audit(self, req: falcon.Request, queue: str, result: str, **target: Any) -> None:
        if self.web.audit is not None:
            self.web.audit.record(req, "new_queue", queue, result, **target)

    def _make(self, req: falcon.Request, resp: falcon.Response) -> str:
        if not self.web.sysconfig.get("allow_new_queue"):
            raise Forbidden("new queues are not allowed here (allow_new_queue is false)")
        pairs = body.read_pairs(req)
        params = dict(pairs)
        fields = body.nested(pairs, "queue") or params
        name = str(fields.get("name", ""))
        if not QUEUE_NAME_RE.match(name):
            raise BadRequest(f"queue name has invalid characters: {name[:80]!r}")
        if name in self.web.layout.queue_names():
            raise BadRequest(f"queue {name} already created")
        overlay = queue_overlay(fields)
        script = self._script(str(fields.get("script", "")), overlay.get("exec_prefix", ""))
        cfg = config.queue_config(name, script, overlay, source="new_queue")
        self.web.layout.create_queue_dir(name, cfg)
        _tell_supervisor()
        url = config.base_url(self.web.sysconfig) + f"q/{name}"
        ok(req, resp, url, params, page=self.web.queue_path(name))
        return name

    def _script(self, script: str, exec_prefix: str) -> str:
        """The script's path, a relative one taken from the root (RQ's working directory)."""
        path = os.path.normpath(os.path.join(self.web.layout.root, script))
        try:
            script_argv(path, exec_prefix)
        except SpawnError as exc:
            raise BadRequest(f"queue not created: {exc}") from exc
        return path


_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")


def queue_overlay(fields: dict[str, Any]) -> dict[str, Any]:
    """Queue settings from form text: numbers converted, empty fields left out."""
    overlay: dict[str, Any] = {}
    if fields.get("num_workers") not in (None, ""):
        overlay["num_workers"] = _int_param(str(fields["num_workers"]), "num_workers", 1)
    for key in ("coalesce_params", "blocking_params"):
        if isinstance(fields.get(key), list):
            overlay[key] = [_int_param(str(v), key, 0) for v in fields[key] if v != ""]
    for key in ("concurrency", "rate_limit"):  # left for the queue schema to judge
        if isinstance(fields.get(key), dict):
            overlay[key] = _limit_fields(fields[key])
    if fields.get("exec_prefix"):
        overlay["exec_prefix"] = str(fields["exec_prefix"])
    if isinstance(fields.get("env_vars"), dict):
        overlay["env_vars"] = {str(k): str(v) for k, v in fields["env_vars"].items()}
    return overlay


def _limit_fields(given: dict[str, Any]) -> dict[str, Any]:
    """A concurrency or rate_limit object from form text: numbers as numbers."""
    out = dict(given)
    for key, value in given.items():
        if isinstance(value, str) and _NUMBER.fullmatch(value):
            out[key] = float(value) if key == "per" or "." in value else int(value)
        elif key == "by" and isinstance(value, list):
            out[key] = [int(v) if isinstance(v, str) and v.isascii() and v.isdigit() else v
                        for v in value]
    return out


def _tell_supervisor() -> None:
    """In embedded mode the supervisor starts daemons for new queues on SIGHUP."""
    pid = os.environ.get("RQ_SUPERVISOR_PID", "")
    if pid.isascii() and pid.isdigit():
        try:
            os.kill(int(pid), signal.SIGHUP)
        except OSError as exc:
            raise RQError(f"queue created, but the supervisor was not told: {exc}") from exc
