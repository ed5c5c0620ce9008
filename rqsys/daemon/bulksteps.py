"""The stepping of a bulk action (a move or a delete of many messages): a
step of the list at a time, each waiting until none of its messages is busy
(in a retry batch, so it is decided where the batch leaves it), the next
once the step's work has called back; the answer after the last.
"""

from __future__ import annotations

from collections.abc import Callable

from rqsys.daemon.transitions import Done, Transitions
from rqsys.errors import BadRequest, RQError

Finish = Callable[[int, int, "BaseException | None"], None]  # (done, passed over, error)


class Steps:
    """A list of ids worked through ``size`` at a time; ``act`` is the step's work."""

    def __init__(self, transitions: Transitions, ids: list[str], finish: Finish,
                 size: int, by: str = "") -> None:
        self.transitions, self.ledger = transitions, transitions.ledger
        self.ids, self.finish, self.size = ids, finish, size
        self.next = 0  # the first id of the next step
        self.done = self.passed = 0
        self.by = by  # who asked (``Request.actor``): named in each delete's entry

    def step(self) -> None:
        """The next step with work to do (a loop, not a recursion: 100,000
        passed over are 2,000 steps); after the last, the answer."""
        while self.next < len(self.ids):
            batch = self.ids[self.next:self.next + self.size]
            if self.ledger.wait_until_free(batch, self.step):
                return  # a retry batch has some: decided where it leaves them
            self.next += self.size
            if self.act(batch):
                return  # it calls step() once its work is durable
        self.finish(self.done, self.passed, None)

    def delete(self, msg_id: str, then: Done, state: str = "") -> bool:
        """Delete one message of a step, counted as done (``then`` once it is
        durable); one gone, running or no longer in ``state`` meanwhile is
        counted as passed over, ``then`` not called.  Whether it was deleted."""
        try:
            if state and self.ledger.store.find(msg_id) != state:
                raise BadRequest(f"{msg_id} is no longer in {state}")
            self.transitions.delete(msg_id, then, self.by)
        except RQError:
            self.passed += 1
            return False
        self.done += 1
        return True

    def act(self, batch: list[str]) -> bool:
        """Start a step's work; True if it will call :meth:`step` when done."""
        raise NotImplementedError
