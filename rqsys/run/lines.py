"""A running script's lines on fd 3 (status, ``dup``) and the answers it reads on fd 4."""

from __future__ import annotations

import os

from rqsys.daemon.context import QueueContext
from rqsys.daemon.intake import Intake
from rqsys.daemon.outbound import Outbound
from rqsys.errors import ProtocolError
from rqsys.life.moments import Moments
from rqsys.observe.events import EventLog
from rqsys.run.dups import Dups
from rqsys.run.protocol import Command
from rqsys.run.verdict import Worker
from rqsys.store import QueueStore


class StatusLines:
    """What the runner's running scripts (``workers``, its table) say."""

    def __init__(self, ctx: QueueContext, store: QueueStore, log: EventLog,
                 workers: dict[str, Worker], intake: Intake, outbound: Outbound,
                 moments: Moments) -> None:
        self.store, self.log, self.workers = store, log, workers
        self.dups = Dups(ctx, store, intake, outbound, moments, self._write_replies)

    def on_lines(self, worker: Worker, lines: list[Command | ProtocolError]) -> None:
        for item in lines:
            self._apply(worker, item)

    def _apply(self, worker: Worker, item: Command | ProtocolError) -> None:
        if isinstance(item, ProtocolError):
            self.log.warn(f"bad status line ignored: {item}", worker.msg_id)
            return
        if item.kind == "dup":
            self.dups.request(worker, item)
            return
        worker.status = item.text
        if item.terminal:
            worker.terminal = item
        if item.text != worker.on_disk:  # a bare "done" leaves a blank status file as it is
            self.store.write_status("run", worker.msg_id, item.text)
            worker.on_disk = item.text
        self.log.record("status", worker.msg_id, item.text, RQ_STATE="run")

    def _write_replies(self, worker: Worker) -> None:
        if self.workers.get(worker.msg_id) is not worker:
            return  # it has ended: its fd 4 is closed (and the number maybe reused)
        for line in worker.ready_replies():
            try:
                os.write(worker.child.reply_w, line.encode())
            except OSError:
                self.log.warn("script does not read fd 4; dup answer dropped", worker.msg_id)
