"""A batch's callback: made once every member has ended, exactly once.

Whoever sees a batch complete makes it: the daemon whose member ended last,
or the creator when the last member ended before the batch was sealed, or a
daemon at start that finds an end it had not written.  More than one may
try: the callback is created with the unique key ``batch:<id>`` (held
``UNIQUE_FOR`` seconds after it ends), so its queue makes one message and
answers the others with it; then its URL is written to ``callback``.

``on_done`` is made when every member ended in done (or relayed); ``on_err``
when any ended in err or was deleted.  It carries ``batch_of``: the batch's
id, total and counts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rqsys.batches import record

UNIQUE_FOR = 31_622_400  # the schema's most: a year
Call = Callable[..., dict[str, Any]]  # call(queue, op, **args) -> the daemon's reply


def key(batch_id: str) -> str:
    return f"batch:{batch_id}"


def settle(path: Path, call: Call) -> str | None:
    """Make the batch's callback if it is complete and has none yet; its URL
    (``none`` when the batch names no callback for how it ended), or None
    while it is not complete."""
    if (done := record.read_mark(path, "callback")) is not None:
        return done
    found = record.progress(path)
    if not found.complete:
        return None
    failed = found.counts["err"] + found.counts["gone"]
    which = found.spec.get("on_err" if failed else "on_done")
    url = "none"
    if which:
        msg = dict(which["msg"], unique_key=key(found.spec["id"]), unique_for=UNIQUE_FOR,
                   batch_of={"id": found.spec["id"], "total": found.spec["total"],
                             **found.counts})
        url = str(call(which["queue"], "create", msg=msg,
                       by=f"batch {found.spec['id']}")["url"])
    record.mark(path, "callback", url)
    return url
