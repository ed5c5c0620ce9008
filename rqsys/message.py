"""The message model: validation of client input, defaults and derived keys."""

from __future__ import annotations

import re
import time
from typing import Any

from rqsys import config
from rqsys.errors import BadRequest, ConfigError

PARAMS = ("param1", "param2", "param3", "param4")
REMOTE_RE = re.compile(r"^https?://")
MAX_MSG_BYTES = 1 << 20  # one message's JSON; attachments carry the bulk


def new_message(data: Any, queue: str) -> dict[str, Any]:
    """A validated message for ``queue`` from client input, with defaults.

    ``dest`` may be omitted (it is the queue itself) or name the queue; any
    other local name is refused here: routing happens before the daemon.
    """
    try:
        msg = config.validate("message", data, "message")
    except ConfigError as exc:
        raise BadRequest(str(exc)) from exc
    msg.setdefault("dest", queue)
    msg.setdefault("max_count", 15)
    msg.setdefault("count", 0)
    msg.setdefault("due", 0)
    return msg


def is_remote(dest: str) -> bool:
    return bool(REMOTE_RE.match(dest))


def param_key(msg: dict[str, Any], numbers: list[int]) -> tuple[str, ...] | None:
    """The tuple of the listed params (1-based), or None when none are listed."""
    if not numbers:
        return None
    return tuple(str(msg.get(f"param{n}", "")) for n in numbers)


def due_time(msg: dict[str, Any]) -> float:
    return float(msg.get("due") or 0)


def is_due(msg: dict[str, Any], now: float | None = None) -> bool:
    return due_time(msg) <= (time.time() if now is None else now)
