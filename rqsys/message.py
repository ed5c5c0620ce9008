"""The message model: validation of client input, defaults, derived keys and field sizes.

A message's fields have size limits, in one place here, chosen so that its
script can always be started.

A queue script gets a message's params and ``orig_msg_id`` in its
environment (``RQ_PARAM1`` .. ``RQ_PARAM4``, ``RQ_ORIG_MSG_ID``), and Linux
refuses to exec (E2BIG) when one environment string, name, ``=`` and NUL
included, is over ``MAX_ARG_STRLEN`` (32 pages: 128 KiB), or when argv and
environment together are over ``ARG_MAX`` (a quarter of the stack limit:
2 MiB with the usual 8 MiB).  Every limit is checked when a message is
created (``check_message``, from ``new_message``, so the
socket, HTTP and the CLI all refuse alike, naming the field and the limit):

==========================  ======================  ==============================
field                       limit (UTF-8 bytes)     why
==========================  ======================  ==============================
param1 .. param4            100 KiB each, no NUL    one env string stays under
                                                    128 KiB; C strings end at NUL
dest, src, orig_msg_id      2 KiB each (no NUL in   names and URLs
                            orig_msg_id)
each post_run_webhook URL   2 KiB (32 URLs: schema) URLs
each relay_via entry        2 KiB (64: schema)      base URLs
the whole message (JSON)    1 MiB                   what the store writes
==========================  ======================  ==============================

So a message puts at most 4 x 100 KiB + 2 KiB into a script's environment,
under a fifth of ARG_MAX's 2 MiB: the rest is left for the daemon's own
environment and the queue's ``env_vars``.  A message that is over them all
the same (written before these limits, or pushed over by a huge
``env_vars``) cannot poison its queue: it alone ends in err
(``rqsys.run.spawn.env_problem`` says why), and the queue goes on.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any
from urllib.parse import urlsplit

from rqsys.errors import BadRequest, ConfigError, TooLarge
from rqsys.store.layout import check_msg_id, check_queue_name

PARAMS = ("param1", "param2", "param3", "param4")
REMOTE_RE = re.compile(r"^https?://")
CREATE_METHODS = ("commit", "prep", "single_que")  # RQ's ``_method`` inside ``mesg``
_RUBY_INT = re.compile(r"\s*[+-]?\d+")
_RUBY_FLOAT = re.compile(r"\s*[+-]?\d+(\.\d+)?([eE][+-]?\d+)?")
_FALSE_WORDS = ("", "0", "false", "no", "off")
TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:=+-]{0,63}$"  # a tag, in the schemas and filters


def new_message(data: Any, queue: str) -> dict[str, Any]:
    """A validated message for ``queue`` from client input, with defaults.

    ``dest`` may be omitted (it is the queue itself) or name the queue; any
    other local name is refused here: routing happens before the daemon.
    Values RQ clients send as strings are converted first (see rq_values).
    """
    from rqsys import config  # here: `rq`, which never validates, starts without jsonschema

    check_message(data)  # every field's size limit (below), so the script can start
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

# ------------------------------------------------------------ message URLs
def message_url(cfg: dict[str, Any], queue: str, msg_id: str) -> str:
    """``http://host:port/root/q/<queue>/<id>`` on the host ``cfg`` (the system config) names."""
    return f"http://{cfg['host']}:{cfg['port']}{cfg['relative_root']}q/{queue}/{msg_id}"


def split_message_url(url: str) -> tuple[str, str]:
    """``http://host:port/root/q/<queue>/<id>`` -> (queue, id)."""
    parts = [p for p in urlsplit(url).path.split("/") if p]
    if len(parts) < 3 or parts[-3] != "q":
        raise BadRequest(f"not a message URL: {url!r}")
    return check_queue_name(parts[-2]), check_msg_id(parts[-1])


# ------------------------------------------------------------ field sizes
KIB = 1024
PARAM_MAX = 100 * KIB
TEXT_MAX = 2 * KIB
MESSAGE_MAX = 1024 * KIB
FIELD_MAX = {"param1": PARAM_MAX, "param2": PARAM_MAX, "param3": PARAM_MAX,
             "param4": PARAM_MAX, "dest": TEXT_MAX, "src": TEXT_MAX, "orig_msg_id": TEXT_MAX}
LIST_ITEM_MAX = {"post_run_webhook": TEXT_MAX, "relay_via": TEXT_MAX}
NO_NUL = ("param1", "param2", "param3", "param4", "orig_msg_id")  # they go into the environment


def check_message(msg: Any) -> None:
    """TooLarge naming the field and its limit when ``msg`` is over one (BadRequest: a NUL)
    (client input, before the schema: what is not a message is the schema's)."""
    if not isinstance(msg, dict):
        return
    for name, limit in FIELD_MAX.items():
        value = msg.get(name)
        if isinstance(value, str):
            _check_text(name, value, limit)
    for name, limit in LIST_ITEM_MAX.items():
        items = msg.get(name) or ()
        if not isinstance(items, (str, list)):
            continue  # not a list: the schema's to refuse
        for n, item in enumerate(items.split() if isinstance(items, str) else items):
            if isinstance(item, str):
                _check_text(f"{name}[{n}]", item, limit)
    if _surely_small(msg):
        return
    size = len(json.dumps(msg).encode())
    if size > MESSAGE_MAX:
        raise TooLarge(f"message too large: {size} bytes as JSON, the limit is "
                         f"{MESSAGE_MAX} bytes (1 MiB); send large data as an attachment")


def _surely_small(msg: dict[str, Any]) -> bool:
    """Whether ``msg`` is surely under MESSAGE_MAX as JSON, without encoding it:
    flat, and short enough even if every character took 12 bytes (a
    ``\\ud83d\\ude00`` pair); a number's digits count 4,400 (Python's limit)."""
    total = 0
    for key, value in msg.items():
        kind = type(value)
        if kind is str:
            total += len(value)
        elif kind in _SCALARS or value is None:
            total += 4400
        else:
            return False
        total += len(key) + 2
    return total * 12 < MESSAGE_MAX


_SCALARS = (int, float, bool)


def _check_text(name: str, value: str, limit: int) -> None:
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise TooLarge(f"{name} too large: {size} bytes, the limit is {limit} bytes "
                         f"({limit // KIB} KiB); send large data as an attachment")
    if name in NO_NUL and "\0" in value:
        raise BadRequest(f"{name} contains a NUL character, which a script's "
                         "environment cannot carry")
