"""The socket operations, and the table that names every one of them.

The simple requests are answered here; those that take new messages in
(``create``, ``attach``, ``clone``) are ``intake``'s.  Each handler gets a
``server.Request`` already checked against its op's schema (``rqsys.wire.schema``).
A request whose change must be durable before its answer (commit,
delete, adminoper, run_now) returns None and is answered from the background
``sync`` lane's callback, so the loop never waits for the disk.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from rqsys import tunables
from rqsys.background import SYNC, Background
from rqsys.daemon import tags
from rqsys.daemon.bulk import Bulk
from rqsys.daemon.context import QueueContext
from rqsys.daemon.intake import Intake
from rqsys.daemon.server import Handler, Reply, Request
from rqsys.daemon.transitions import Transitions
from rqsys.errors import BadRequest
from rqsys.observe import lastlines, timeline
from rqsys.observe.events import EventLog
from rqsys.run.runner import Runner
from rqsys.store import ADMIN_OPERS, QueueStore

ALREADY_COMMITTED = ("que", "run", "done", "relayed")  # a commit of these is answered ok


def table(ops: Ops, intake: Intake) -> dict[str, Handler]:
    """Every operation of the socket protocol, and who answers it."""
    return {
        "ping": ops.ping, "counts": ops.counts, "config": ops.config, "list": ops.list,
        "get": ops.get, "state": ops.state, "status": ops.status,
        "create": intake.create, "attach": intake.attach, "clone": intake.clone,
        "create_many": Bulk(intake).create_many,
        "commit": ops.commit, "run_now": ops.run_now,
        "delete": ops.delete, "destroy": ops.destroy, "cancel": ops.cancel, "prune": ops.prune,
        "adminoper": ops.adminoper, "reload": ops.reload,
    }


class Ops:
    """The handlers of the simple requests."""

    def __init__(self, ctx: QueueContext, store: QueueStore, transitions: Transitions,
                 runner: Runner, background: Background, log: EventLog,
                 reload: Callable[[], None], status_line: Callable[[], str]) -> None:
        self.ctx, self.store, self.runner = ctx, store, runner
        self.stops = runner.stops  # a cancel, a destroy
        self.transitions, self.ledger = transitions, transitions.ledger
        self.background, self.log = background, log
        self._reload, self._status_line = reload, status_line

    # ------------------------------------------------------------ reading
    def ping(self, r: Request) -> Reply:
        return {"ok": True, "queue": self.ctx.name, "pid": os.getpid()}

    def counts(self, r: Request) -> Reply:
        # RQ: "asking for status is a kick" (its admin files are read again)
        return {"ok": True, "counts": self.ledger.counts(), "admin": self.ctx.refresh_admin(),
                "num_workers": self.ctx.config["num_workers"], "status": self._status_line(),
                "room": self.ledger.schedule.room.usage()}

    def config(self, r: Request) -> Reply:
        return {"ok": True, "config": self.ctx.config, "admin": self.ctx.refresh_admin()}

    def list(self, r: Request) -> Reply:
        state = r.args.get("state", "que")
        offset = int(r.args.get("offset", 0))
        limit = min(int(r.args.get("limit", 50)), tunables.MAX_LIST)
        if r.args.get("tag"):
            ids, total = tags.page(self.ledger, self.store, state, r.args["tag"], offset, limit)
            return {"ok": True, "ids": ids, "total": total}
        return {"ok": True, "ids": self.ledger.page(state, offset, limit),
                "total": self.ledger.count(state)}

    def get(self, r: Request) -> Reply:
        msg_id = r.args["msg_id"]
        worker = self.runner.workers.get(msg_id)
        state = "run" if worker else self.store.find(msg_id)
        msg = dict(worker.msg) if worker else self.store.read_msg(state, msg_id)
        status = worker.status if worker else self.store.read_status(state, msg_id)
        self.log.flush()  # this turn's timeline lines too (they are written once a turn)
        events = timeline.read_folded(self.store.msg_dir(state, msg_id))
        return {"ok": True, "msg": msg, "state": state, "status": status,
                "url": self.ctx.url(msg_id), "attachments": self._attachments(state, msg_id),
                **timeline.times(events, float(msg.get("due") or 0)),
                "cancelled": state == "err" and timeline.cancelled(events),
                "timeline": timeline.shown(events, tunables.TIMELINE_SHOWN),
                "last_lines": lastlines.read(self.store.msg_dir(state, msg_id))
                if state == "err" else []}

    def _attachments(self, state: str, msg_id: str) -> dict[str, Any]:
        found = {}
        for path in self.store.attachments(state, msg_id):
            found[path.name] = {"md5": self.store.attachment_md5(path),
                                "size": path.stat().st_size, "path": str(path)}
        return found

    def state(self, r: Request) -> Reply:
        msg_id = r.args["msg_id"]
        return {"ok": True, "state": "run" if msg_id in self.runner.workers
                else self.store.find(msg_id)}

    def status(self, r: Request) -> Reply:
        msg_id = r.args["msg_id"]
        worker = self.runner.workers.get(msg_id)
        state = "run" if worker else self.store.find(msg_id)
        status = worker.status if worker else self.store.read_status(state, msg_id)
        return {"ok": True, "state": state, "status": status}

    # ------------------------------------------------------------ changing
    def commit(self, r: Request) -> Reply | None:
        msg_id = r.args["msg_id"]
        self.ctx.check_accepting()
        reply = {"ok": True, "msg_id": msg_id, "url": self.ctx.url(msg_id)}
        state = self.store.find(msg_id)
        if state in ALREADY_COMMITTED:
            return {**reply, "already": state}
        self.transitions.commit(msg_id, _when_durable(r, reply))
        return None

    def run_now(self, r: Request) -> None:
        self.transitions.run_now(r.args["msg_id"], _when_durable(r, {"ok": True}))

    def delete(self, r: Request) -> None:
        self.transitions.delete(r.args["msg_id"], _when_durable(r, {"ok": True}), r.actor())

    def destroy(self, r: Request) -> Reply | None:
        """Delete a message; a running one has its whole process group killed first."""
        worker = self.runner.workers.get(r.args["msg_id"])
        if worker is None:
            self.transitions.delete(r.args["msg_id"], _when_durable(r, {"ok": True}), r.actor())
            return None
        self.stops.destroy(worker)
        return {"ok": True, "killed": True}

    def cancel(self, r: Request) -> Reply | None:
        """A queued message to err, ``cancelled by <who>``, answered once
        durable; a running one is stopped (TERM to its group, KILL after
        stop_grace) and ends so: answered at once, ``stopping``."""
        msg_id, who = r.args["msg_id"], r.claimed()
        worker = self.runner.workers.get(msg_id)
        if worker is not None:
            self.stops.cancel(worker, who)
            return {"ok": True, "stopping": True}
        self.transitions.cancel(msg_id, f"cancelled by {who}", _when_durable(r, {"ok": True}))
        return None

    def prune(self, r: Request) -> None:
        """The cleaner's request: drop done/relayed older than ``days``, acknowledged
        errs, and, given ``prep_days``, prep messages untouched that long."""
        days = _days(r.args.get("days", 3), "days")
        prep_days = r.args.get("prep_days")
        if prep_days is not None:
            prep_days = _days(prep_days, "prep_days")
        reply: Reply = {"ok": True}  # answered once the removals are durable
        reply["removed"] = self.transitions.prune(time.time(), days, prep_days,
                                             _when_durable(r, reply))
        return None

    def adminoper(self, r: Request) -> None:
        """up, down, pause or resume: in force once durable (then answered with
        the queue's state, which RQ's admin files may keep stricter; ``up`` and
        ``resume`` remove RQ's ``.down`` and ``.pause`` files as RQ's do)."""
        oper = r.args["oper"]
        admin = ADMIN_OPERS[oper]

        def save() -> None:
            self.store.set_admin_state(admin)
            if self.ctx.files is not None:
                self.ctx.files.remove_for(oper)

        def saved(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                r.fail(error)
                return
            self.ctx.admin_oper = admin
            self.log.event("daemon", f"admin state {self.ctx.refresh_admin()} "
                           f"(adminoper {admin}, RQ's admin files {self.ctx.admin_files})")
            r.answer({"ok": True, "admin": self.ctx.admin})

        self.background.submit(save, saved, SYNC)

    def reload(self, r: Request) -> Reply:
        self._reload()
        return {"ok": True}


def _when_durable(r: Request, reply: Reply) -> Callable[[BaseException | None], None]:
    """The callback that answers ``r`` once its change is on disk (or failed)."""
    def done(error: BaseException | None) -> None:
        r.fail(error) if error is not None else r.answer(reply)

    return done


def _days(value: Any, what: str) -> float:
    days = float(value)
    if not days >= 0:  # NaN too, which the schema's minimum lets through
        raise BadRequest(f"prune needs {what} >= 0")
    return days
