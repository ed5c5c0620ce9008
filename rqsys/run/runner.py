"""Running queue scripts: starting them (environment, fds), their status
lines and dup requests on fd 3, the answers on fd 4, and their exits.

A start sent to the fork server (``starts``) has its worker at once, pid 0:
it holds its slot, and signals sent to it wait for its pid; it is watched,
said started and given its limits when the answer comes, or ends as a start
that failed.  Each script's status pipe and pidfd are watched by
``children``.  Where a message goes when its script ends is
``transitions``' business; its dup requests ``dups``'.
"""

from __future__ import annotations

import errno
import selectors
import time
from typing import Any

from rqsys.daemon.context import QueueContext
from rqsys.daemon.intake import Intake
from rqsys.daemon.loopclock import LoopClock
from rqsys.daemon.outbound import Outbound
from rqsys.daemon.transitions import Msg, Transitions
from rqsys.errors import SpawnError
from rqsys.fdclose import FdBatch
from rqsys.life.moments import Moments
from rqsys.observe.events import EventLog
from rqsys.run import spawn
from rqsys.run.children import Children
from rqsys.run.credentials import CredentialError, Credentials
from rqsys.run.deadlines import budget, timed_out_text
from rqsys.run.environment import RunEnvironment
from rqsys.run.exits import Exits
from rqsys.run.handoff import HANDED, HandOff
from rqsys.run.identity import Identity
from rqsys.run.limits import RunLimits
from rqsys.run.lines import StatusLines
from rqsys.run.output import ScriptOutput
from rqsys.run.scriptcheck import ScriptCheck
from rqsys.run.spawn import ExecFailed
from rqsys.run.starts import Starts
from rqsys.run.stops import Stops
from rqsys.run.verdict import Outcome, Worker
from rqsys.store import QueueStore

Bounds = tuple[dict[str, Any] | None, float | None]  # a run's limits, and the time it has left


class Runner:
    """The queue's running scripts (at most ``num_workers``)."""

    def __init__(self, ctx: QueueContext, store: QueueStore, transitions: Transitions,
                 selector: selectors.BaseSelector, output: ScriptOutput, log: EventLog,
                 intake: Intake, outbound: Outbound, clock: LoopClock,
                 closing: FdBatch, moments: Moments, run_keys: frozenset[str]) -> None:
        self.ctx, self.store, self.selector, self.moments = ctx, store, selector, moments
        self.transitions, self.ledger = transitions, transitions.ledger
        self.output, self.log = output, log
        self.identity = Identity(ctx.name, ctx.layout.queue_dir(ctx.name), log, ctx.config)
        self.starts = Starts(clock, closing, self.identity, selector, log,  # timed
                             lambda: self.ledger.schedule.backlog())
        self.workers: dict[str, Worker] = {}  # the table of running scripts, by message id
        self.script = ScriptCheck(ctx, log)
        self.credentials = Credentials(ctx.layout.root, ctx.name, log, ctx.config,
                                       owner=self.identity)
        self.env = RunEnvironment(ctx, self.credentials, self.identity, run_keys)
        self.lines = StatusLines(ctx, store, log, self.workers, intake, outbound, moments)
        ledger = self.ledger
        self.handoff = HandOff(self.env, lambda i: i in ledger.schedule or bool(ledger.busy(i)))
        self.limits = RunLimits(ctx, outbound.background, log)
        self.limits.recover()
        self.stops = Stops(ctx, store, log, self.workers, self.limits)  # timeouts, cancels
        self.exits = Exits(ctx, store, transitions, log, self.workers, self.limits,
                           self.credentials, output, outbound, moments)
        self.children = Children(selector, self.lines.on_lines, self.exits.on_exit, closing,
                                 ctx, log, self.stops.deadlines.after, self.starts.children)

    @property
    def script_error(self) -> str:
        """Why the queue's script cannot be started (SCRIPTERROR), or ""."""
        return self.script.error

    # ------------------------------------------------------------ starting
    def can_start(self) -> bool:
        self.transitions.slots_outside(self.limits.ending)
        return (self.ctx.admin == "UP" and not self.ctx.stopping and self.limits.ready
                and not (self.credentials.refusal or self.identity.refusal)
                and self.ledger.has_free_slot() and not self.store.room.check()  # a full disk
                and self.script.ready())

    def next_wait(self) -> float | None:
        """Seconds until a script may start or one must be stopped (its
        timeout); None when nothing waits for time."""
        waits = [w for w in (self._start_wait(), self.stops.deadlines.wait()) if w is not None]
        return min(waits) if waits else None

    def _start_wait(self) -> float | None:
        if self.script.error:
            return self.script.wait()
        if self.store.room.full:  # queued ones start once there is room
            return self.store.room.recheck_in() if self.ledger.count("que") else None
        if self.can_start():
            due = self.ledger.next_due()
            if due is not None:
                return due - time.time()
        return None

    def start_due(self) -> None:
        """Start scripts for due messages while workers are free."""
        now = time.time()
        due = self.ledger.next_due()
        if due is None or due > now:
            return
        if not self.can_start():
            return
        resolved = self.script.resolve()  # once a turn
        if resolved is None:
            return
        path, argv = resolved
        while self.can_start():
            picked = self.transitions.start_next(now)
            if picked is None:
                return
            self._start(path, argv, *picked)

    def _start(self, path: str, argv: list[str], msg_id: str, queued: Msg, msg: Msg) -> None:
        blank = self.transitions.take_blank_status(msg_id)
        left = budget(msg, self.ctx.config)
        if left is not None and left <= 0:  # earlier runs cut short used it all
            text = timed_out_text(msg, self.ctx.config)
            self.log.event("timeout", f"{text} (in runs cut short)", msg_id, RQ_STATE="run")
            self.exits.conclude(msg_id, msg, Outcome("err", text, kind="timeout"), None)
            return
        job = self.store.job_path(msg_id)  # made by the child when a spare did not bring it
        if (run := self._run_env(msg_id, msg, argv[-1], job)) is None:
            return
        limits = self.limits.for_message(msg)
        program, words = self.limits.gated(path, argv) if limits else (path, argv)

        def then(err: int) -> None:  # the fork server's answer
            self._spawned(msg_id, queued, ExecFailed(program, err) if err else None, run, argv,
                          (limits, left))

        out, handed = None, None
        try:
            out = self.output.stdout_fd(job, msg_id, msg["count"])  # None: the child opens it
            if not (limits or self.identity.switch):
                handed = self.handoff.start(path, run, job, out)
            if handed is None:
                out, given = None, out  # the start closes it
                child = self.starts.spawn(words, program, self.env.strings(), run, job, given,
                                          self.limits.as_limit(limits) if limits else -1, then)
        except (SpawnError, UnicodeEncodeError) as exc:
            self._spawned(msg_id, queued, exc, run, argv, (limits, left))
            return
        finally:
            if out is not None:
                self.starts.leave(out)  # the worker has its copy (or none will run)
        worker = self.workers[msg_id] = Worker(msg_id, msg, handed or child)
        worker.on_disk = "" if blank else None
        if worker.child.pid or handed:  # else started once the fork server answers
            self._running(worker, (limits, left), handed is not None)
        else:
            self.log.moved(msg_id, "run")  # its started event comes with the answer

    def _spawned(self, msg_id: str, queued: Msg, failed: SpawnError | UnicodeEncodeError | None,
                 run: dict[str, str], argv: list[str], bounds: Bounds) -> None:
        """A start's end: running (its signals sent meanwhile delivered), or not started."""
        worker = self.workers.get(msg_id)
        if failed is None and worker is not None:
            for sig in worker.child.early:
                worker.child.signal_group(sig)
            self._running(worker, bounds)
            return
        if worker is not None:  # the fork server's: the script's pipes are closed now
            del self.workers[msg_id]
            self.starts.leave(*worker.child.release())
        self.script.path.forget()  # resolved again before the next start
        self._not_started(msg_id, queued, failed or SpawnError("not started"),
                          {**self.env.shared(), **run}, argv)

    def _running(self, worker: Worker, bounds: Bounds, handed: bool = False) -> None:
        """A started script: watched, its riders, timeout and limits taken, said."""
        msg_id, msg = worker.msg_id, worker.msg
        limits, left = bounds
        self.transitions.coalesce(msg_id, msg, self.ctx.url(msg_id))
        self.children.watch(worker)
        if left is not None:
            self.stops.arm_timeout(worker, left)
        if limits:
            self.stops.limit(worker, limits)
        pid = worker.child.pid
        who, field = ((f"handed to the {HANDED}", {"RQ_HANDED": HANDED}) if handed
                      else (f"pid {pid}", {"RQ_PID": pid}))  # a hand-over: no pid
        self.log.event("started", f"{who}, count {msg['count']}", msg_id,
                       RQ_COUNT=msg["count"], RQ_STATE="run", **field,
                       RQ_RUN=msg["count"] + 1, RQ_DUE=msg.get("due") or 0)

    def _run_env(self, msg_id: str, msg: Msg, real: str, job: str) -> dict[str, str] | None:
        """A run's own variables (and credentials); None: they cannot be, it ended in err."""
        try:
            run = self.env.of_run(msg_id, msg, real, job, self.ledger.gpus_of(msg_id))
            for hook in self.moments.starting:
                hook(msg_id, msg, run)
            return run
        except CredentialError as exc:  # named, never their content
            self.log.event("err", str(exc), msg_id, RQ_STATE="run")
            self.exits.conclude(msg_id, msg, Outcome("err", str(exc), kind="err"), None)
            return None

    def _not_started(self, msg_id: str, queued: Msg, exc: SpawnError | UnicodeEncodeError,
                     env: dict[str, str], argv: list[str]) -> None:
        """Not started.  When the message is why (E2BIG, the queue's own environment
        fitting; a lone surrogate stored before intake refused them), it alone ends
        in err; else the queue's script is (SCRIPTERROR): it waits in que."""
        self.credentials.close_run(msg_id)
        not_run = Outcome("que", f"not started: {exc}")
        for hook in self.moments.run_over:
            hook(msg_id, not_run, None)
        errno_ = getattr(exc, "errno", None)
        why = "its params hold a lone UTF-16 surrogate" if isinstance(exc, UnicodeError) else ""
        if errno_ == errno.E2BIG and not spawn.env_problem(self.env.shared(), tuple(argv)):
            why = spawn.env_problem(env, tuple(argv)) or "its environment is too large"
            why = f"{exc} ({why})"
        if why:
            text = f"cannot start the script for this message: {why}"
            self.log.event("err", text, msg_id)
            self.exits.webhooks(self.transitions.end(msg_id, Outcome("err", text), ""))
            return
        if errno_ == errno.E2BIG:
            exc = SpawnError(f"{exc}: the queue's own environment is too large "
                             f"({spawn.env_problem(self.env.shared(), tuple(argv))})")
        self.transitions.unstart(msg_id, queued, f"SCRIPTERROR: {exc}")
        self.script.fail(str(exc))

    def reconfigured(self) -> None:
        """After a reload: check a SCRIPTERROR script again now; a new environment."""
        self.script.reconfigured()
        self.identity.configure(self.ctx.config)
        self.credentials.configure(self.ctx.config)
        self.env.forget()

