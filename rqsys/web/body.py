"""Request bodies: bounded form / JSON / multipart parsing and the message a client sends.

Forms may use Rack's nested names as RQ's own pages do (``mesg[param1]``,
``queue[name]``, ``queue[coalesce_params][]``); :func:`nested` rebuilds them.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

import falcon

from rqsys.errors import BadRequest, TooLarge
from rqsys.web.answers import safe_back

MAX_BODY = 2 << 20  # a message is at most 1 MB of JSON; attachments go by multipart
FORM_FIELDS = ("dest", "src", "param1", "param2", "param3", "param4", "due", "max_count",
               "orig_msg_id", "force_remote", "priority", "timeout", "retry_max", "tags",
               "unique_key", "unique_for", "after", "after_policy")
RQ_FORM_FIELDS = (*FORM_FIELDS, "count", "post_run_webhook", "_method")
_NESTED = re.compile(r"\[([^\[\]]*)\]")

Pairs = list[tuple[str, Any]]


def read_params(req: falcon.Request) -> dict[str, Any]:
    """Query and body parameters (form, multipart form or a JSON object) in one dict."""
    return dict(read_pairs(req))


def read_pairs(req: falcon.Request) -> Pairs:
    """Query and body parameters in order, repeated names kept (for ``name[]``);
    a ``back`` checked before anything is done (a bad one answered 400 after
    the action, which had happened)."""
    pairs = _read_pairs(req)
    for name, value in pairs:
        if name == "back" and value:
            check_back(value)
    return pairs


def text_of(params: dict[str, Any]) -> Callable[[str], str | None]:
    """``params.get`` for fields that must be text: a JSON body's number or
    list for one is a 400 naming it (it was a 500)."""
    def get(name: str) -> str | None:
        value = params.get(name)
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"{name} must be text, not a {type(value).__name__}")
        return value
    return get


def check_back(back: Any) -> str:
    """``back``, a path on this site (``answers.safe_back``), or BadRequest."""
    if not isinstance(back, str):
        raise BadRequest("back must be a path on this site, not a " + type(back).__name__)
    return safe_back(back)


def _read_pairs(req: falcon.Request) -> Pairs:
    pairs: Pairs = list(parse_qsl(req.query_string, keep_blank_values=True))
    ctype = (req.content_type or "").split(";")[0].strip().lower()
    if ctype == "multipart/form-data":
        _check_length(req)
        return pairs + _multipart_fields(req)
    raw = _read_bounded(req)
    if not raw:
        return pairs
    if ctype == "application/json":
        return pairs + list(_json_body(raw).items())
    if ctype in ("application/x-www-form-urlencoded", ""):
        return pairs + _form_body(raw)
    raise BadRequest(f"unsupported content type {ctype[:60]!r} "
                     "(use a form, a multipart form or application/json)")


def _check_length(req: falcon.Request) -> None:
    length = req.content_length
    if length is not None and length > MAX_BODY:
        raise TooLarge(f"request body of {length} bytes is over the limit of {MAX_BODY}")


def _read_bounded(req: falcon.Request) -> bytes:
    _check_length(req)
    raw = req.bounded_stream.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise TooLarge(f"request body is over the limit of {MAX_BODY} bytes")
    return bytes(raw)


def _multipart_fields(req: falcon.Request) -> Pairs:
    """The text fields of a multipart form (file parts are skipped: no route wants them)."""
    fields: Pairs = []
    try:
        for part in req.get_media():
            if part.filename:
                part.stream.read()
                continue
            fields.append((part.name, part.get_text() or ""))
    except falcon.MediaMalformedError as exc:
        raise BadRequest(f"malformed multipart form: {exc.description or exc.title}") from exc
    return fields


def _json_body(raw: bytes) -> dict[str, Any]:
    """A JSON body is either the message itself or ``{"mesg": ..., "_method": ...}``."""
    data = _parse_json(raw, "request body")
    if not isinstance(data, dict):
        raise BadRequest("a JSON body must be an object")
    if "mesg" in data:
        return data
    return {"mesg": data}


def _form_body(raw: bytes) -> Pairs:
    try:
        text = raw.decode("utf-8")
        return list(parse_qsl(text, keep_blank_values=True, strict_parsing=False))
    except UnicodeDecodeError as exc:
        raise BadRequest(f"form is not UTF-8: {exc}") from exc


def _parse_json(raw: bytes | str, what: str) -> Any:
    try:
        return json.loads(raw, parse_constant=_not_json)
    except ValueError as exc:
        raise BadRequest(f"{what} is not valid JSON: {exc}") from exc


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def nested(pairs: Pairs, prefix: str) -> dict[str, Any]:
    """Rack's reading of ``prefix[a]=1``, ``prefix[b][]=2``, ``prefix[c][d]=3``."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if not key.startswith(prefix + "["):
            continue
        path = _NESTED.findall(key[len(prefix):])
        if path:
            _put(found, path, value)
    return found


def _put(into: dict[str, Any], path: list[str], value: Any) -> None:
    head, rest = path[0], path[1:]
    if not rest:
        into[head] = value
    elif rest == [""]:
        bucket = into.setdefault(head, [])
        if isinstance(bucket, list):
            bucket.append(value)
    else:
        child = into.setdefault(head, {})
        if isinstance(child, dict):
            _put(child, rest, value)


def message_from(params: dict[str, Any], pairs: Pairs | None = None) -> dict[str, Any]:
    """The message: ``mesg`` (JSON text or object), RQ's ``mesg[field]`` form fields,
    or our form's ``mesg_*`` fields."""
    if "mesg" in params:
        mesg = params["mesg"]
        msg = _parse_json(mesg, "mesg") if isinstance(mesg, str) else mesg
        if not isinstance(msg, dict):
            raise BadRequest("mesg must be a JSON object")
        return msg
    rq_form = nested(pairs or list(params.items()), "mesg")
    if rq_form:
        return {k: v for k, v in rq_form.items() if k in RQ_FORM_FIELDS and v != ""}
    return _from_form_fields(params)


def _from_form_fields(params: dict[str, Any]) -> dict[str, Any]:
    msg: dict[str, Any] = {}
    for field in FORM_FIELDS:
        value = params.get(f"mesg_{field}")
        if value is None or value == "":
            continue
        msg[field] = _typed(field, str(value))
    if not msg:
        raise BadRequest("no message: send mesg=<JSON>, mesg[field] or mesg_* form fields")
    return msg


def _typed(field: str, value: str) -> Any:
    if field == "due" and "T" in value:  # the form's date-time input: UTC
        return _utc_time(value)
    try:
        if field in ("max_count", "priority", "retry_max"):
            return int(value)
        if field in ("due", "timeout", "unique_for"):
            number = float(value)
            if not math.isfinite(number):  # nan, inf: no time
                raise ValueError(value)
            return number
    except ValueError as exc:
        raise BadRequest(f"mesg_{field} must be a number, not {value[:40]!r}") from exc
    if field == "force_remote":
        return value.lower() in ("1", "true", "on", "yes")
    if field in ("tags", "after"):  # words or URLs, by commas or spaces
        return value.replace(",", " ").split()
    return value


def _utc_time(value: str) -> float:
    """``2026-11-28T10:30`` (or with seconds) as UTC, in Unix seconds."""
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError as exc:
        raise BadRequest(f"mesg_due must be a date and time (2026-11-28T10:30) or a number, "
                         f"not {value[:40]!r}") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()
