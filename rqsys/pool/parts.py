"""What a pool member uses of its queue daemon, handed over at construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the daemon imports the pool: only the types from there
    from rqsys.batches.ends import BatchEnds
    from rqsys.daemon.context import QueueContext
    from rqsys.daemon.intake import Intake
    from rqsys.daemon.transitions import Transitions
    from rqsys.observe.events import EventLog
    from rqsys.pool.ids import PoolIds
    from rqsys.run.runner import Runner
    from rqsys.store import QueueStore


@dataclass(frozen=True)
class QueueParts:
    """The queue daemon's collaborators a pool member works with."""

    ctx: QueueContext
    store: QueueStore
    transitions: Transitions
    intake: Intake
    runner: Runner
    log: EventLog
    batch_ends: BatchEnds
    ids: PoolIds  # the store's id maker, numbered when the host joins
