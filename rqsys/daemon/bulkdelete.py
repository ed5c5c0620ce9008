"""A bulk delete (a search's matches, or a failure group), ``STEP`` messages
a step: each is synced on its own, and the next step starts once they are
durable, so the loop serves every other client in between.

A step first waits until none of its messages is busy (in a retry batch),
then decides each where it is then: one no longer in the searched state
(the index lags the store by a moment; the store decides), gone or running
is passed over.
"""

from __future__ import annotations

from rqsys.daemon.bulksteps import Finish, Steps
from rqsys.daemon.transitions import Transitions

STEP = 50  # messages deleted a step


class Deletion(Steps):
    """One bulk delete of a list of ids, answered through ``finish``."""

    def __init__(self, transitions: Transitions, ids: list[str], state: str,
                 finish: Finish, by: str = "") -> None:
        super().__init__(transitions, ids, finish, STEP, by)
        self.state = state
        self.left = 0  # deletes of this step not durable yet

    def act(self, batch: list[str]) -> bool:
        """Start a step's deletes; True if some will call back."""
        self.left = 1  # held until all are started
        for msg_id in batch:  # (the index lags the store: the store decides)
            if self.delete(msg_id, self._durable, self.state):
                self.left += 1
        self.left -= 1
        return self.left > 0

    def _durable(self, _error: BaseException | None) -> None:
        """One delete is durable (one that failed to sync is redone at the next start)."""
        self.left -= 1
        if self.left == 0:
            self.step()
