"""The message model: validation of client input, defaults and derived keys."""

from __future__ import annotations

import re
import time
from typing import Any

from rqsys.errors import BadRequest, ConfigError
from rqsys.limits import check_message

PARAMS = ("param1", "param2", "param3", "param4")
REMOTE_RE = re.compile(r"^https?://")
MAX_MSG_BYTES = 1 << 20  # one message's JSON; attachments carry the bulk
CREATE_METHODS = ("commit", "prep", "single_que")  # RQ's ``_method`` inside ``mesg``
_RUBY_INT = re.compile(r"\s*[+-]?\d+")
_RUBY_FLOAT = re.compile(r"\s*[+-]?\d+(\.\d+)?([eE][+-]?\d+)?")
_FALSE_WORDS = ("", "0", "false", "no", "off")


def new_message(data: Any, queue: str) -> dict[str, Any]:
    """A validated message for ``queue`` from client input, with defaults.

    ``dest`` may be omitted (it is the queue itself) or name the queue; any
    other local name is refused here: routing happens before the daemon.
    Values RQ clients send as strings are converted first (see rq_values).
    """
    from rqsys import config  # here: `rq`, which never validates, starts without jsonschema

    check_message(data)  # every field's size limit (rqsys.limits), so the script can start
    if isinstance(data, dict) and "unique_for" in data and "unique_key" not in data:
        raise BadRequest("message: unique_for needs a unique_key")
    try:
        msg = config.validate("message", rq_values(data), "message")
    except ConfigError as exc:
        raise BadRequest(str(exc)) from exc
    msg.setdefault("dest", queue)
    msg.setdefault("max_count", 15)
    msg.setdefault("count", 0)
    msg.setdefault("due", 0)
    return msg


def rq_values(data: Any) -> Any:
    """``data`` with the string values RQ's clients send converted as RQ does.

    RQ's CLI and web send every field as a string: ``count`` and
    ``max_count`` become integers (Ruby's ``to_i``: the leading digits, 0
    when there are none), ``due`` a number (``to_f``), a ``post_run_webhook``
    string its space-separated URLs, a ``force_remote`` string true unless
    it says no.  Anything else is left for the schema to judge.
    """
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for key in ("count", "max_count"):
        if isinstance(out.get(key), str):
            out[key] = _ruby_number(_RUBY_INT, out[key], int)
    if isinstance(out.get("due"), str):
        out["due"] = _ruby_number(_RUBY_FLOAT, out["due"], float)
    if isinstance(out.get("post_run_webhook"), str):
        out["post_run_webhook"] = out["post_run_webhook"].split()
    if isinstance(out.get("force_remote"), str):
        out["force_remote"] = out["force_remote"].strip().lower() not in _FALSE_WORDS
    for key in ("unique_for", "slot"):  # ours, from a form: a number, or left for the schema
        if isinstance(out.get(key), str) and _RUBY_FLOAT.fullmatch(out[key]):
            out[key] = float(out[key])
    return out


def _ruby_number(pattern: re.Pattern[str], text: str, kind: type) -> Any:
    found = pattern.match(text)
    return kind(found.group(0)) if found else kind(0)


def split_method(data: Any, default: str = "commit") -> tuple[Any, str]:
    """(message without ``_method``, the method): RQ puts ``_method`` inside ``mesg``."""
    if not isinstance(data, dict) or "_method" not in data:
        return data, default
    msg = dict(data)
    method = msg.pop("_method")
    if method not in CREATE_METHODS:
        raise BadRequest(f"_method must be commit, prep or single_que, not {str(method)[:40]!r}")
    return msg, str(method)


def is_remote(dest: str) -> bool:
    return bool(REMOTE_RE.match(dest))


def param_key(msg: dict[str, Any], numbers: list[int]) -> tuple[str, ...] | None:
    """The tuple of the listed params (1-based), or None when none are listed."""
    if not numbers:
        return None
    return tuple(str(msg.get(f"param{n}", "")) for n in numbers)


def due_time(msg: dict[str, Any]) -> float:
    due = msg.get("due")
    return float(due) if due else 0.0  # one shared 0.0: a float each was 2 MiB of 100,000


def is_due(msg: dict[str, Any], now: float | None = None) -> bool:
    return due_time(msg) <= (time.time() if now is None else now)
