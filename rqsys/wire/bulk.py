"""Bulk enqueue from a client's side: messages from NDJSON lines or a JSON
array, sent in batches of ``create_many`` requests, results in order.

Used by ``rq sendmesg --bulk`` and ``POST /q/<q>/new_messages``.  Each
batch is one request (one group commit in the daemon); a line that is not
JSON fails alone, as a message the daemon refuses does, with its index
(counted from 0 over the whole input).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rqsys.errors import BadRequest, TooLarge
from rqsys.wire.framing import LineTooLong

BATCH = 1000  # messages per create_many request: answers flow back as the input streams
Result = dict[str, Any]  # {"msg_id", "url"} or {"index", "error", "kind"}


def ndjson(lines: Iterable[bytes | str | BadRequest]) -> Iterator[Any]:
    """The messages of NDJSON lines (blank lines skipped); a bad line is a BadRequest."""
    for line in lines:
        if isinstance(line, BadRequest):  # refused by the reader (a line too long)
            yield line
            continue
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError as exc:
            yield BadRequest(f"not a JSON message: {exc}")


def send(items: Iterable[Any], call: Callable[[list[Any]], list[Result]],
         defaults: dict[str, Any] | None = None) -> Iterator[Result]:
    """Create ``items`` through ``call`` (a create_many: messages -> results),
    ``BATCH`` at a time; yields one result per item, in order."""
    index = 0
    for batch in _batches(items):
        good = [_with(item, defaults) for item in batch if not isinstance(item, BadRequest)]
        answers = iter(_create(call, good) if good else [])
        for item in batch:
            got = _failed(item) if isinstance(item, BadRequest) else dict(next(answers))
            if "error" in got:
                got["index"] = index
            yield got
            index += 1


def _create(call: Callable[[list[Any]], list[Result]], msgs: list[Any]) -> Iterator[Result]:
    """``call(msgs)``'s results, in halves while the request is over the
    socket's line limit (BATCH counts messages; large ones fill a line
    sooner); a half's are yielded before the next is sent, so a failure of
    the next leaves them answered, not lost."""
    try:
        results = call(msgs)
    except LineTooLong as exc:
        if len(msgs) == 1:
            yield _failed(TooLarge(f"message too large to send: {exc}"))
            return
        half = len(msgs) // 2
        yield from _create(call, msgs[:half])
        yield from _create(call, msgs[half:])
        return
    yield from results


def _with(item: Any, defaults: dict[str, Any] | None) -> Any:
    return {**defaults, **item} if defaults and isinstance(item, dict) else item


def _failed(error: BadRequest) -> Result:
    return {"error": str(error), "kind": type(error).__name__}


def _batches(items: Iterable[Any]) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch
