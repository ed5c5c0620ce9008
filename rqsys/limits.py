"""The size limits of a message's fields, in one place, chosen so that its
script can always be started.

A queue script gets a message's params and ``orig_msg_id`` in its
environment (``RQ_PARAM1`` .. ``RQ_PARAM4``, ``RQ_ORIG_MSG_ID``), and Linux
refuses to exec (E2BIG) when one environment string, name, ``=`` and NUL
included, is over ``MAX_ARG_STRLEN`` (32 pages: 128 KiB), or when argv and
environment together are over ``ARG_MAX`` (a quarter of the stack limit:
2 MiB with the usual 8 MiB).  Every limit is checked when a message is
created (``check_message``, from ``rqsys.message.new_message``, so the
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
(``env_problem`` says why), and the queue goes on.
"""

from __future__ import annotations

import json
import os
from typing import Any

from rqsys.errors import BadRequest, TooLarge

KIB = 1024
PARAM_MAX = 100 * KIB
TEXT_MAX = 2 * KIB
MESSAGE_MAX = 1024 * KIB
MAX_ARG_STRLEN = 32 * 4096  # Linux: one argv or environment string, its NUL included
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


def arg_max() -> int:
    """The kernel's limit on argv and environment together (bytes)."""
    try:
        return int(os.sysconf("SC_ARG_MAX"))
    except (ValueError, OSError):
        return 2 * KIB * KIB


def env_size(env: dict[str, str], argv: tuple[str, ...] = ()) -> int:
    """What exec counts against ARG_MAX: each string, its NUL and its pointer."""
    strings = [f"{key}={value}" for key, value in env.items()] + list(argv)
    return sum(len(os.fsencode(text)) + 1 + 8 for text in strings)


def env_problem(env: dict[str, str], argv: tuple[str, ...] = ()) -> str:
    """Why exec would refuse this environment (E2BIG), or "" when it fits."""
    for key, value in env.items():
        size = len(os.fsencode(key)) + len(os.fsencode(value)) + 2  # "=" and NUL
        if size > MAX_ARG_STRLEN:
            return (f"environment variable {key} is {size} bytes; Linux takes at most "
                    f"{MAX_ARG_STRLEN} bytes in one")
    total = env_size(env, argv)
    if total > arg_max():
        return f"argv and environment are {total} bytes; ARG_MAX is {arg_max()}"
    return ""
