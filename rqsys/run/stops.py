"""Stopping running scripts: their timeouts, a cancel, a destroy, the daemon's stop.

A stop TERMs the script's whole process group and KILLs it after
``stop_grace``; its message ends as the runner's exit path decides
(``stop_reason``: timeout, cancel, destroy, stopping).
"""

from __future__ import annotations

import signal
from typing import Any

from rqsys.daemon.context import QueueContext
from rqsys.errors import BadRequest
from rqsys.observe.events import EventLog
from rqsys.run import resources
from rqsys.run.deadlines import Deadlines, timed_out_text
from rqsys.run.limits import RunLimits
from rqsys.run.verdict import Worker
from rqsys.store import QueueStore


class Stops:
    """The stops of the runner's running scripts (``workers``, its table)."""

    def __init__(self, ctx: QueueContext, store: QueueStore, log: EventLog,
                 workers: dict[str, Worker], limits: RunLimits) -> None:
        self.ctx, self.store, self.log = ctx, store, log
        self.workers, self.limits = workers, limits
        self.deadlines = Deadlines()  # timeouts and their escalation to SIGKILL

    def arm_timeout(self, worker: Worker, seconds: float) -> None:
        if why := self.store.write_started(worker.msg_id, worker.started):  # recovery's
            self.log.event("warning", why, worker.msg_id)  # estimate of the time used
        self.deadlines.after(seconds, lambda: self._time_out(worker))

    def limit(self, worker: Worker, limits: dict[str, Any]) -> None:
        """Hold a run's limits; its runtime_max is a timeout of its own."""
        self.limits.started(worker, limits)
        if "runtime_max" in limits:
            seconds = float(limits["runtime_max"])
            text = f"killed: runtime limit {resources.runtime_text(seconds)}"
            self.deadlines.after(seconds, lambda: self._time_out(worker, text))

    def _time_out(self, worker: Worker, text: str = "") -> None:
        if self.workers.get(worker.msg_id) is not worker or worker.stop_reason:
            return  # ended, destroyed, or the daemon is stopping it anyway
        self._stop(worker, "timeout", text or timed_out_text(worker.msg, self.ctx.config))

    def _stop(self, worker: Worker, reason: str, text: str) -> None:
        """TERM the script's whole process group, KILL it after stop_grace."""
        worker.stop_reason, worker.stop_text = reason, text
        self.log.event(reason, f"{text}: SIGTERM to its process group", worker.msg_id,
                       RQ_STATE="run")
        worker.child.signal_group(signal.SIGTERM)
        self.deadlines.after(float(self.ctx.config["stop_grace"]), lambda: self._kill(worker))

    def _kill(self, worker: Worker) -> None:
        if self.workers.get(worker.msg_id) is worker:
            self.log.event(worker.stop_reason, "still running after stop_grace: SIGKILL",
                           worker.msg_id, RQ_STATE="run")
            worker.child.signal_group(signal.SIGKILL)

    def cancel(self, worker: Worker, who: str) -> None:
        """Stop a running message as a timeout does; it ends in err, ``cancelled by <who>``."""
        if worker.stop_reason:
            raise BadRequest(f"message {worker.msg_id} is being stopped already "
                             f"({worker.stop_reason})")
        self._stop(worker, "cancel", f"cancelled by {who}")

    def destroy(self, worker: Worker) -> None:
        """Kill a running message's whole process group; it is deleted when it exits."""
        worker.stop_reason = "destroy"
        self.log.record("destroy", worker.msg_id, "destroy requested", RQ_STATE="run")
        worker.child.signal_group(signal.SIGKILL)

    def stop_all(self) -> None:
        """The daemon stops: TERM every script; their messages go back to que."""
        for worker in self.workers.values():
            worker.stop_reason = worker.stop_reason or "stopping"
            worker.child.signal_group(signal.SIGTERM)

    def kill_all(self) -> None:
        for worker in self.workers.values():
            worker.child.signal_group(signal.SIGKILL)
