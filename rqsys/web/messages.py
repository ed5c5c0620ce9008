"""Message routes: view (HTML/JSON), state, delete/destroy/commit, clone, run now,
attachments (upload and download)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import falcon

from rqsys.errors import BadRequest, NotFound
from rqsys.observe import timeline, tracing
from rqsys.run import protocol
from rqsys.store import check_attach_name
from rqsys.web import body, logs, msgpage, upload
from rqsys.web.answers import ok
from rqsys.web.auth import actor
from rqsys.web.context import Resource, Web, queue_and_id, split_suffix

POST_METHODS = ("delete", "destroy", "commit", "retry", "cancel")  # retry: err → que, in place
MOVES_FOLLOWED = 3  # states a message may pass through while its attachment is opened


def message_json(web: Web, queue: str, msg_id: str) -> dict[str, Any]:
    """RQ's message JSON: the message's fields, ``state``, ``status`` as RQ words it
    (``"<state> - <text>"``) and ``_attachments`` (md5 and size; no server paths)."""
    got = web.call(queue, "get", msg_id=msg_id)
    attachments = {name: {k: v for k, v in info.items() if k != "path"}
                   for name, info in got["attachments"].items()}
    times = {key: got.get(key) for key in timeline.TIME_FIELDS}
    running = got["state"] == "run"
    trace = tracing.trace_id(str(got["msg"].get(tracing.FIELD) or ""))
    traced = {"trace_id": trace} if trace else {}
    return dict(got["msg"], msg_id=msg_id, url=web.msg_url(queue, msg_id), state=got["state"],
                status=rq_status_text(got["state"], got["status"]),
                status_text=got["status"], _attachments=attachments, **times, **traced,
                progress=protocol.progress(got["status"]) if running else None,
                last_lines=got.get("last_lines", []), cancelled=bool(got.get("cancelled")),
                _timeline=got.get("timeline", []))


def rq_status_text(state: str, text: str) -> str:
    """RQ's message status: the state, then `` - `` and the script's last words."""
    return f"{state} - {text}" if text else state


class MessageResource(Resource):
    """``/q/<q>/<id>`` (HTML), ``.json``; POST ``_method`` delete | destroy | commit |
    retry | cancel."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str, mid: str) -> None:
        mid, suffix = split_suffix(mid, (".json",))
        queue, msg_id = queue_and_id(name, mid)
        if suffix:
            resp.media = message_json(self.web, queue, msg_id)
        else:
            msgpage.message_page(self.web, req, resp, queue,
                                 message_json(self.web, queue, msg_id))

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str, mid: str) -> None:
        queue, msg_id = queue_and_id(name, mid)
        params = body.read_params(req)
        method = params.get("_method")
        if method not in POST_METHODS:
            raise BadRequest(f"_method must be one of {', '.join(POST_METHODS)}")
        extra = {"by": actor(req)} if method == "cancel" else {}
        self.web.act(req, queue, method, msg_id=msg_id, **extra)
        value = self.web.msg_url(queue, msg_id) if method == "commit" else f"{method}: done"
        ok(req, resp, value, params, page=self.web.queue_path(queue))


class MessageState(Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str, mid: str) -> None:
        queue, msg_id = queue_and_id(name, mid)
        resp.media = [self.web.call(queue, "state", msg_id=msg_id)["state"]]


class Clone(Resource):
    """``POST /q/<q>/<id>/clone``: a new message with the same fields and attachments."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str, mid: str) -> None:
        queue, msg_id = queue_and_id(name, mid)
        params = body.read_params(req)
        got = self.web.act(req, queue, "clone", msg_id=msg_id)
        ok(req, resp, self.web.msg_url(queue, got["msg_id"]), params,
           page=self.web.msg_path(queue, got["msg_id"]))


class RunNow(Resource):
    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str, mid: str) -> None:
        queue, msg_id = queue_and_id(name, mid)
        params = body.read_params(req)
        self.web.act(req, queue, "run_now", msg_id=msg_id)
        ok(req, resp, self.web.msg_url(queue, msg_id), params,
           page=self.web.msg_path(queue, msg_id))


class AttachNew(Resource):
    """``POST /q/<q>/<id>/attach/new``: stream ``filedata`` and hand its fd to the daemon."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str, mid: str) -> None:
        queue, msg_id = queue_and_id(name, mid)
        if self.web.store(queue).find(msg_id) != "prep":
            raise BadRequest(f"message {msg_id} is not in prep: attach before commit")
        query = dict(parse_qsl(req.query_string))  # the body is the upload itself
        if query.get("back"):
            body.check_back(query["back"])  # before the upload is taken, not after
        fallback = Path(self.web.sysconfig["tmpdir"])
        got = upload.receive(req, self.web.layout.queue_dir(queue), fallback)
        try:
            self.web.act(req, queue, "attach", fds=[got.fd], msg_id=msg_id, name=got.name,
                          md5=got.md5)
        finally:
            os.close(got.fd)
        ok(req, resp, f"{got.md5}-Attached successfully", query,
           page=self.web.msg_path(queue, msg_id))


class AttachFile(Resource):
    """``GET /q/<q>/<id>/attach/<name>``: the attachment's bytes (Range honoured)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str, mid: str,
               aname: str) -> None:
        queue, msg_id = queue_and_id(name, mid)
        fd = self._open(queue, msg_id, check_attach_name(aname))
        resp.downloadable_as = aname
        logs.send_file(req, resp, fd, "application/octet-stream")

    def _open(self, queue: str, msg_id: str, aname: str) -> int:
        """The attachment, opened; looked up again when its message moved
        between the look-up and the open (a run's start or end meanwhile)."""
        path = logs.attachment_path(self.web, queue, msg_id, aname)
        for _ in range(MOVES_FOLLOWED):
            try:
                return logs.open_stored(self.web.layout.queue_dir(queue), path)
            except FileNotFoundError:
                moved = logs.attachment_path(self.web, queue, msg_id, aname)
                if moved == path:
                    break  # where it was: there is no such attachment
                path = moved
        raise NotFound(f"message {msg_id} has no attachment {aname}")
