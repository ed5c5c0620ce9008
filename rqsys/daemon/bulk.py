"""Bulk enqueue: many new messages in one request (``create_many``), made
durable by one group commit and answered in order.

Each message is checked and staged on its own: a bad one fails alone, with
its index and why, and the others are created.  All that were staged join
the loop turn's group commit (``intake.publish_pending``: one ``syncfs``
for the lot), and the request is answered once every one of them is
durable: ``{"ok": true, "results": [{"msg_id", "url"} | {"index", "error",
"kind"}, ...]}``, one entry per message, in the order sent.  A message
with a ``unique_key`` is refused here (send it alone: its answer may have to
wait for another request's holder).
"""

from __future__ import annotations

from typing import Any

from rqsys.daemon.intake import Intake
from rqsys.daemon.room import check_create
from rqsys.daemon.server import Reply, Request
from rqsys.daemon.unique import key_of
from rqsys.errors import BadRequest, RQError, StoreError
from rqsys.message import new_message
from rqsys.run.deadlines import check_timeout
from rqsys.store import Staged


class Bulk:
    """The ``create_many`` operation, on top of the intake's group commit."""

    def __init__(self, intake: Intake) -> None:
        self.intake = intake

    def create_many(self, r: Request) -> Reply | None:
        state = r.args.get("state", "que")
        self.intake.ctx.check_accepting(strict=bool(r.args.get("refuse_paused")))
        msgs = r.args["msgs"]
        results: list[dict[str, Any]] = [{} for _ in msgs]
        staged = [self._stage_one(n, data, state, r, results) for n, data in enumerate(msgs)]
        waiting = [(n, one) for n, one in enumerate(staged) if one is not None]
        if not waiting:
            return {"ok": True, "results": results}
        left = [len(waiting)]
        for n, one in waiting:
            self.intake.pending.append((one, state, self._then(n, one, results, left, r)))
        return None

    def _stage_one(self, n: int, data: Any, state: str, r: Request,
                   results: list[dict[str, Any]]) -> Staged | None:
        """Check and stage message ``n``; None (and why, in ``results``) if refused."""
        ctx = self.intake.ctx
        try:
            msg = new_message(data, ctx.name)
            ctx.check_dest(msg, r.require_on)
            check_timeout(msg, ctx.config)
            check_create(msg, ctx.config)  # slots and needs that could never fit
            if key_of(msg) is not None:
                raise BadRequest("unique_key: not taken in a bulk create; send it alone")
            if msg.get("after") and self.intake.after.normalise(msg):
                raise BadRequest("after: another host's messages are checked for one "
                                 "create alone; send it alone")
            staged = self.intake.store.stage(msg, state)
        except RQError as exc:
            results[n] = _failed(n, exc)
            return None
        except OSError as exc:
            results[n] = _failed(n, StoreError(f"not stored: {exc}"))
            return None
        staged.origin = r.claimed()
        return staged

    def _then(self, n: int, staged: Staged, results: list[dict[str, Any]], left: list[int],
              r: Request) -> Any:
        def published(error: BaseException | None) -> None:
            if error is None:
                results[n] = {"msg_id": staged.msg_id, "url": self.intake.ctx.url(staged.msg_id)}
            else:
                results[n] = _failed(n, error)
            left[0] -= 1
            if left[0] == 0:
                r.answer({"ok": True, "results": results})

        return published


def _failed(n: int, error: BaseException) -> dict[str, Any]:
    return {"index": n, "error": str(error), "kind": type(error).__name__}
