"""The filter language of the console's one search box: ``key:value`` words and free text.

    state:err queue:etl-* tag:nightly param1:~2026-11 priority:>5 since:1h "ValueError"

* ``state:S``      one of the states (``rqsys.store.STATES``)
* ``queue:GLOB``   queues whose names match (``*``, ``?``, ``[..]``); repeated: any
* ``tag:T``        carries the tag T
* ``paramN:V``     param N (1-4) is V; ``paramN:~V``: holds V
* ``priority:OP N`` with OP one of ``>``, ``>=``, ``<``, ``<=``, ``=`` (none: ``=``)
* ``since:W``, ``until:W``  created since / before W: ``90m``, ``2h``, ``3d`` ago, a
  Unix time or an ISO date (``rqsys.search.query.parse_when``)
* any other word, or ``"a phrase"``: found in params, tags, status or last line

A lower-case word before a colon that is none of these keys is refused,
with the keys named (``stat:err`` is a mistake, not a search for "stat"
and "err"); ``ValueError:``, ``10:30`` or a URL are searched as words.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from rqsys.errors import BadRequest
from rqsys.search.query import parse_when
from rqsys.store import STATES

KEYS = ("state", "queue", "tag", "param1", "param2", "param3", "param4", "priority",
        "since", "until")
KEY = re.compile(r"[a-z][a-z0-9_]*")  # a word that reads as key:value (not "ValueError:")
PRIORITY = re.compile(r"(>=|<=|>|<|=)?(-?\d{1,9})")
MAX_VALUE = 500


@dataclass
class Filter:
    """A parsed filter: the queues it names (globs; none: all) and the search's args."""

    queues: list[str] = field(default_factory=list)
    args: dict[str, Any] = field(default_factory=dict)

    def takes(self, queue: str) -> bool:
        """Whether ``queue`` is one of those the filter names."""
        return not self.queues or any(fnmatch.fnmatchcase(queue, g) for g in self.queues)


def parse(text: str, now: float | None = None) -> Filter:
    """The filter ``text`` says; BadRequest names what is wrong in it."""
    try:
        words = shlex.split(text)
    except ValueError as exc:  # an unclosed quote
        raise BadRequest(f"search: {exc}") from None
    found, free = Filter(), []
    for word in words:
        key, colon, value = word.partition(":")
        if not colon or not KEY.fullmatch(key) or value.startswith("//"):
            free.append(word)
            continue
        if key not in KEYS:
            raise BadRequest(f"search: no key {key!r} (the keys: {', '.join(KEYS)}; "
                             f'quote a word with a colon: "{word[:40]}")')
        _take(found, key, value, now)
    if free:
        found.args["text"] = " ".join(free)[:MAX_VALUE]
    return found


def _take(found: Filter, key: str, value: str, now: float | None) -> None:
    if not value:
        raise BadRequest(f"search: {key}: says nothing (say {key}:something)")
    if len(value) > MAX_VALUE:
        raise BadRequest(f"search: {key}: at most {MAX_VALUE} characters")
    args = found.args
    if key == "state":
        if value not in STATES:
            raise BadRequest(f"search: state must be one of {', '.join(STATES)}, "
                             f"not {value[:40]!r}")
        args["state"] = value
    elif key == "queue":
        found.queues.append(value)
    elif key == "tag":
        args["tag"] = value
    elif key.startswith("param"):
        has = value.startswith("~")
        args.setdefault("params", {})[key[-1]] = {"op": "has" if has else "eq",
                                                  "value": value[1:] if has else value}
    elif key == "priority":
        m = PRIORITY.fullmatch(value)
        if m is None:
            raise BadRequest(f"search: priority: say >5, <=0 or 3, not {value[:40]!r}")
        args["priority"] = {"op": m.group(1) or "=", "value": int(m.group(2))}
    else:  # since, until
        args[key] = parse_when(value, key, now)


def completions(queues: list[str]) -> list[str]:
    """What the box offers as a word begins: each key, each state, each queue."""
    return [*(f"{k}:" for k in KEYS if k not in ("state", "queue")),
            *(f"state:{s}" for s in STATES), *(f"queue:{q}" for q in queues)]
