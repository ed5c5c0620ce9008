"""Message ids unique across a pool's hosts.

RQ's ids (``YYYYmmdd.HHMM.SS.mmm.n``) are unique per host only.  A pool's
host claims a number (1..99) in the pool's KV bucket when it joins (an
atomic create of ``host.<n>``: the first host to create a key owns it, and
finds it again by its own name at the next start).  Its ids end in
``n * 100 + host``: the last two digits name the host, so two hosts never
make the same id, and the id keeps RQ's form (``rqsys.store.MSG_ID_RE``).
"""

from __future__ import annotations

from rqsys.errors import InternalError
from rqsys.store.layout import IdMaker

MAX_HOSTS = 99


class PoolIds(IdMaker):
    """RQ-form ids whose last two digits are this host's number in the pool
    (an IdMaker: a pool queue's store makes its prep messages' ids with it)."""

    def __init__(self, host_number: int = 0, maker: IdMaker | None = None) -> None:
        # The ids come from ``maker``'s clock and sequence: IdMaker's own state is unused.
        self.host_number = 0  # none until the host joins its pool
        self._maker = maker or IdMaker()
        if host_number:
            self.join(host_number)

    def join(self, host_number: int) -> None:
        """The host's number in the pool, claimed as it joined."""
        if not 1 <= host_number <= MAX_HOSTS:
            raise ValueError(f"host number {host_number} not in 1..{MAX_HOSTS}")
        self.host_number = host_number

    def next_id(self) -> str:
        if not self.host_number:
            raise InternalError("a pool queue made an id before it joined its pool")
        stamp, _, n = self._maker.next_id().rpartition(".")
        return f"{stamp}.{int(n) * 100 + self.host_number}"


def host_of(msg_id: str) -> int:
    """The number of the host that made a pool id."""
    return int(msg_id.rpartition(".")[2]) % 100
