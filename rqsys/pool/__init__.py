"""Pool queues: one logical queue worked by many hosts through NATS JetStream.

A queue whose config names a ``pool`` publishes its new messages to the
pool's work-queue stream instead of placing them in its own ``que/``; each
host's daemon pulls as many as it has free workers, runs them as local
messages and acks them once its store has recorded the end.  Nothing here
imports ``nats`` until :func:`member_for` is called, for a pool queue
only (``rqsys.daemon.features``): a plain queue never loads it.

* ``settings`` names and limits of a pool, from the two configs (no NATS)
* ``ids``      message ids unique across the pool's hosts
* ``bridge``   an asyncio loop on its own thread, results back to the daemon loop
* ``link``     the NATS side: connect, stream, consumer, KV bucket, publish, fetch, acks
* ``parts``    what a member uses of its queue daemon, handed over at construction
* ``member``   the daemon side: joining, create, lookups, figures, stopping
* ``worker``   pulling for free workers, materialising, in-progress acks, ack/nak
* ``acks``     an end recorded in the bucket, then acked, tried again until NATS answers
* ``redelivery`` whether a redelivery runs: looked up first (another host may have ended it)
* ``insist``   bucket writes that must happen (a single key let go), tried until NATS answers
* ``files``    attachments in the pool's object store: put, fetched and checked, removed
* ``batchends`` a batch member's end carried to the host that made it, through the bucket
* ``unique``   unique keys held in the pool's KV bucket: claimed at create, let go at the end
* ``limits``   concurrency and rate limits held across the hosts, in the KV bucket (CAS)
* ``admission`` a fetched message's places in the limits: placed, kept waiting, or sent back
* ``report``   ``rq pools`` (asks the queue daemons; imports nothing of NATS)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rqsys.batches.ends import BatchEnds
    from rqsys.daemon.context import QueueContext
    from rqsys.daemon.intake import Intake
    from rqsys.daemon.transitions import Transitions
    from rqsys.observe.events import EventLog
    from rqsys.pool.ids import PoolIds
    from rqsys.pool.member import PoolMember
    from rqsys.run.runner import Runner
    from rqsys.store import QueueStore


def member_for(ctx: QueueContext, store: QueueStore, transitions: Transitions, intake: Intake,
               runner: Runner, log: EventLog, batch_ends: BatchEnds,
               ids: PoolIds) -> PoolMember:
    """The pool side of a pool queue's daemon (NATS imported only now)."""
    from rqsys.pool.member import PoolMember
    from rqsys.pool.parts import QueueParts

    return PoolMember(QueueParts(ctx, store, transitions, intake, runner, log,
                                 batch_ends, ids))
