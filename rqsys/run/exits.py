"""A run's end: its script's exit, its verdict, and where the message goes.

The script was reaped (``children``); a limited run waits until all it
started is gone (``limits``).  The verdict (``verdict``, ``backoff``) is
handed to ``transitions.end``; a failure keeps its output's last lines; a
message that ended calls its ``post_run_webhook``.  The moment ``run_over``
comes first (``rqsys.life.moments``).
"""

from __future__ import annotations

import time

from rqsys.daemon.context import QueueContext
from rqsys.daemon.outbound import Outbound
from rqsys.daemon.transitions import Ended, Msg, Transitions
from rqsys.life.moments import Moments
from rqsys.observe import lastlines, timeline
from rqsys.observe.events import EventLog
from rqsys.run.backoff import retried
from rqsys.run.credentials import Credentials
from rqsys.run.deadlines import USED, budget, time_used
from rqsys.run.limits import Run, RunLimits, explain
from rqsys.run.output import ScriptOutput
from rqsys.run.verdict import Outcome, Worker
from rqsys.store import QueueStore


class Exits:
    """The ends of the runner's runs (``workers``, its table)."""

    def __init__(self, ctx: QueueContext, store: QueueStore, transitions: Transitions,
                 log: EventLog, workers: dict[str, Worker], limits: RunLimits,
                 credentials: Credentials, output: ScriptOutput, outbound: Outbound,
                 moments: Moments) -> None:
        self.ctx, self.store, self.transitions, self.log = ctx, store, transitions, log
        self.workers, self.limits, self.credentials = workers, limits, credentials
        self.output, self.outbound, self.moments = output, outbound, moments

    def on_exit(self, worker: Worker, wait_status: int) -> None:
        """The script ended, was reaped (its fds closed with the turn's: ``fdclose``)."""
        del self.workers[worker.msg_id]
        self.log.record("exit", worker.msg_id, **timeline.exit_fields(
            wait_status, worker.rusage, time.time() - worker.started))
        if self.limits.tracks(worker.msg_id):
            self.limits.finish(worker, lambda run: self._end(worker, wait_status, run))
            return
        self._end(worker, wait_status)

    def _end(self, worker: Worker, wait_status: int, run: Run | None = None) -> None:
        """The message ends (a limited run's once everything it started is gone)."""
        outcome = worker.verdict(wait_status, int(worker.msg.get("max_count", 15)))
        outcome = explain(run, outcome) if run is not None else self.limits.queue_oom(outcome)
        if outcome.state == "err":
            self._keep_last_lines(worker.msg_id, worker.msg, outcome)
        self.conclude(worker.msg_id, worker.msg, outcome, worker.on_disk, worker)

    def _keep_last_lines(self, msg_id: str, msg: Msg, outcome: Outcome) -> None:
        """Why it failed: its output's last lines beside its status, and this
        run's own in its end's record (``observe.lastlines``)."""
        self.output.take_now(msg_id)
        log = f"{self.store.job_path(msg_id)}/stdio.log"
        lines = lastlines.of_log(log)
        if why := self.store.write_last_lines(msg_id, lastlines.encode(lines)):  # [] too:
            self.log.event("warning", why, msg_id)  # an earlier failure's are not this one's
        outcome.last_line = lines[-1] if lines else ""
        own, size = lastlines.of_run(log, int(msg.get(lastlines.LOG_AT) or 0))
        outcome.tail = own[-lastlines.PER_RUN:]
        outcome.fields[lastlines.LOG_AT] = size  # where a retry's output will begin

    def conclude(self, msg_id: str, msg: Msg, outcome: Outcome, on_disk: str | None,
                  worker: Worker | None = None) -> None:
        """End a run: retried when the queue's policy says so (``retry``)."""
        self.credentials.close_run(msg_id)  # its directory, once all it started is gone
        for hook in self.moments.run_over:
            hook(msg_id, outcome, worker)
        outcome = retried(outcome, msg, self.ctx.config)
        if outcome.state == "que" and (USED in msg or budget(msg, self.ctx.config)):
            outcome.fields[USED] = time_used(worker)
        self.webhooks(self.transitions.end(msg_id, outcome, on_disk))

    def webhooks(self, ended: list[Ended]) -> None:
        """Call the post_run_webhook of each message that ended."""
        for msg_id, msg, outcome in ended:
            if msg.get("post_run_webhook"):
                self.outbound.webhook(msg_id, msg, outcome)
