"""Request bodies: bounded form / JSON parsing and the message a client sends."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

import falcon

from rqsys.errors import BadRequest
from rqsys.web.answers import TooLarge

MAX_BODY = 2 << 20  # a message is at most 1 MB of JSON; attachments go by multipart
FORM_FIELDS = ("dest", "src", "param1", "param2", "param3", "param4", "due", "max_count",
               "orig_msg_id", "force_remote")


def read_params(req: falcon.Request) -> dict[str, Any]:
    """Query and body parameters (urlencoded form or a JSON object) in one dict."""
    params: dict[str, Any] = dict(req.params)
    raw = _read_bounded(req)
    if not raw:
        return params
    ctype = (req.content_type or "").split(";")[0].strip().lower()
    if ctype == "application/json":
        params.update(_json_body(raw))
    elif ctype in ("application/x-www-form-urlencoded", ""):
        params.update(_form_body(raw))
    else:
        raise BadRequest(f"unsupported content type {ctype[:60]!r} "
                         "(use a form or application/json)")
    return params


def _read_bounded(req: falcon.Request) -> bytes:
    length = req.content_length
    if length is not None and length > MAX_BODY:
        raise TooLarge(f"request body of {length} bytes is over the limit of {MAX_BODY}")
    raw = req.bounded_stream.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise TooLarge(f"request body is over the limit of {MAX_BODY} bytes")
    return bytes(raw)


def _json_body(raw: bytes) -> dict[str, Any]:
    """A JSON body is either the message itself or ``{"mesg": ..., "_method": ...}``."""
    data = _parse_json(raw, "request body")
    if not isinstance(data, dict):
        raise BadRequest("a JSON body must be an object")
    if "mesg" in data:
        return data
    return {"mesg": data}


def _form_body(raw: bytes) -> dict[str, str]:
    try:
        text = raw.decode("utf-8")
        return dict(parse_qsl(text, keep_blank_values=True, strict_parsing=False))
    except UnicodeDecodeError as exc:
        raise BadRequest(f"form is not UTF-8: {exc}") from exc


def _parse_json(raw: bytes | str, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"{what} is not valid JSON: {exc}") from exc


def message_from(params: dict[str, Any]) -> dict[str, Any]:
    """The message: ``mesg`` (JSON text or object), else the form's ``mesg_*`` fields."""
    if "mesg" in params:
        mesg = params["mesg"]
        msg = _parse_json(mesg, "mesg") if isinstance(mesg, str) else mesg
        if not isinstance(msg, dict):
            raise BadRequest("mesg must be a JSON object")
        return msg
    return _from_form_fields(params)


def _from_form_fields(params: dict[str, Any]) -> dict[str, Any]:
    msg: dict[str, Any] = {}
    for field in FORM_FIELDS:
        value = params.get(f"mesg_{field}")
        if value is None or value == "":
            continue
        msg[field] = _typed(field, str(value))
    if not msg:
        raise BadRequest("no message: send mesg=<JSON> or mesg_* form fields")
    return msg


def _typed(field: str, value: str) -> Any:
    try:
        if field == "due":
            return float(value)
        if field == "max_count":
            return int(value)
    except ValueError as exc:
        raise BadRequest(f"mesg_{field} must be a number, not {value[:40]!r}") from exc
    if field == "force_remote":
        return value.lower() in ("1", "true", "on", "yes")
    return value
