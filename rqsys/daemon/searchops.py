"""The ``search`` and ``bulk`` socket operations, and the batches that carry out
an action on many messages while the queue keeps answering.

``search`` runs its SQL in the ``search`` background lane (its own thread and
SQLite connection) and is answered from the loop when it ends.  ``bulk``
(retry or delete every message matching a search) finds the ids the same way,
then retries them in batches whose renames and fsyncs run on a background
lane (``rqsys.daemon.bulkretry``), so the loop serves every other client
meanwhile, and answers once the last batch is durable; a delete goes in
steps too (``rqsys.daemon.bulkdelete``).  A failure group's retry or delete
goes through the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rqsys.background import Background
from rqsys.daemon.bulkdelete import Deletion
from rqsys.daemon.bulkmove import Mover
from rqsys.daemon.bulkretry import BulkRetry
from rqsys.daemon.context import QueueContext
from rqsys.daemon.server import Reply, Request
from rqsys.daemon.transitions import Transitions
from rqsys.errors import BadRequest, RQError, StoreError
from rqsys.search import query
from rqsys.search.index import SearchIndex
from rqsys.store import QUEUE_NAME_RE, QueueStore
from rqsys.wire.schema import MSG_ID, request

LANE = "search"
SCHEMAS: dict[str, dict[str, Any]] = {
    "search": request(**query.SCHEMA),
    "bulk": request(("action",), action={"title": "bulk action", "enum": list(query.ACTIONS)},
                    dest={"title": "dest (queue to move to)", "type": "string",
                          "pattern": QUEUE_NAME_RE.pattern},
                    ids={"title": "ids (the chosen messages)", "type": "array",
                         "items": MSG_ID, "minItems": 1, "maxItems": query.MAX_LIMIT},
                    **query.SCHEMA),
}
Finish = Callable[[int, int, "BaseException | None"], None]  # (done, passed over, error)


class Batches:
    """Retry (``BulkRetry``) or delete a list of messages, a step at a time."""

    def __init__(self, transitions: Transitions, background: Background) -> None:
        self.transitions, self.background = transitions, background

    def run(self, ids: list[str], action: str, finish: Finish, state: str = "",
            by: str = "") -> None:
        """``state``: a delete passes over a message no longer in it (the index
        lags the store by a moment; the store decides); ``by``: who asked."""
        if action == "retry":
            BulkRetry(self.transitions, self.background, ids, finish, by).start()
        else:
            Deletion(self.transitions, ids, state, finish, by).step()


class SearchOps:
    """The index (a sink of the daemon's events) and the operations that read it."""

    def __init__(self, ctx: QueueContext, store: QueueStore, transitions: Transitions,
                 background: Background) -> None:
        self.ctx, self.background = ctx, background
        ledger = transitions.ledger
        running = ledger.running
        self.index = SearchIndex(store, ledger.schedule.msgs.get,  # a create's msg from memory
                                 lambda: bool(running))
        self.batches = Batches(transitions, background)
        self.mover = Mover(ctx, store, transitions, background)

    def ops(self) -> dict[str, Callable[[Request], Reply | None]]:
        return {"search": self.search_op, "bulk": self.bulk_op}

    def _query(self, work: Callable[[Any], Any], then: Callable[[Any], None],
               r: Request) -> None:
        path = self.index.path

        def answered(result: Any, error: BaseException | None) -> None:
            if error is not None:
                r.fail(error if isinstance(error, RQError) else
                       StoreError(f"search index of {self.ctx.name}: {error}"))
            else:
                then(result)
        self.background.submit(lambda: work(query.reader(path)), answered, LANE)

    def search_op(self, r: Request) -> None:
        """A page of matching messages, answered from the search lane."""
        args = dict(r.args)
        partial = not self.index.ready.is_set()
        self._query(lambda db: query.search(db, args),
                    lambda got: r.answer({"ok": True, "partial": partial, **got}), r)

    def bulk_op(self, r: Request) -> None:
        """Retry, delete or move (to ``dest``) all that match, or the chosen
        ``ids`` (in ``state``: those no longer in it are passed over), in
        steps; answered with how many were acted on and passed over, once all
        of it is durable."""
        args, by = dict(r.args), r.actor()
        action, dest, chosen = args.pop("action"), args.pop("dest", ""), args.pop("ids", None)
        if (action == "move") != bool(dest) or dest == self.ctx.name:
            raise BadRequest("dest: name another queue to move to (with action move only)")
        if dest:
            r.require_on(dest)  # who asks makes messages there: an operator of it too
        if action == "retry" and args.get("state", "err") != "err":
            raise BadRequest(f"action retry applies to err messages, not {args['state']}")
        if action == "retry":
            args["state"] = "err"
        if args.get("state") == "run":
            raise BadRequest("state run: a running message is destroyed one at a time")

        def found(ids: list[str]) -> None:
            def finish(done: int, passed: int, error: BaseException | None) -> None:
                if error is not None:
                    r.fail(error)
                else:
                    r.answer({"ok": True, "action": action, "matched": len(ids),
                              "count": done, "passed_over": passed})
            if action == "move":
                self.mover.run(ids, dest, args.get("state", ""), finish, by, r.acting())
            else:
                self.batches.run(ids, action, finish, args.get("state", ""), by)
        if chosen is not None:
            found(list(dict.fromkeys(chosen)))  # once each, as chosen
            return
        self._query(lambda db: query.all_ids(db, args), found, r)
