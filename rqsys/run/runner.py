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
import os
import selectors
import time
from typing import Any

from rqsys import tunables
from rqsys.daemon.context import QueueContext
from rqsys.daemon.intake import Intake
from rqsys.daemon.loopclock import LoopClock
from rqsys.daemon.outbound import Outbound
from rqsys.daemon.transitions import Ended, Msg, Transitions
from rqsys.errors import ProtocolError, SpawnError
from rqsys.fdclose import FdBatch
from rqsys.life.moments import Moments
from rqsys.observe import lastlines, timeline
from rqsys.observe.events import EventLog
from rqsys.run import spawn
from rqsys.run.backoff import retried
from rqsys.run.children import Children
from rqsys.run.credentials import CredentialError, Credentials
from rqsys.run.deadlines import USED, budget, time_used, timed_out_text
from rqsys.run.dups import Dups
from rqsys.run.environment import RunEnvironment
from rqsys.run.handoff import HANDED, HandOff
from rqsys.run.identity import Identity
from rqsys.run.limits import Run, RunLimits, explain
from rqsys.run.output import ScriptOutput
from rqsys.run.protocol import Command
from rqsys.run.spawn import ExecFailed, ScriptPath, script_argv
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
        self.output, self.log, self.intake, self.outbound = output, log, intake, outbound
        self.identity = Identity(ctx.name, ctx.layout.queue_dir(ctx.name), log, ctx.config)
        self.starts = Starts(clock, closing, self.identity, selector, log,  # timed
                             lambda: self.ledger.schedule.backlog())
        self.workers: dict[str, Worker] = {}
        self.script_error = ""  # why the script cannot be started (SCRIPTERROR), or ""
        self._script_check_at = 0.0
        self._script = ScriptPath()
        self.credentials = Credentials(ctx.layout.root, ctx.name, log, ctx.config,
                                       owner=self.identity)
        self.env = RunEnvironment(ctx, self.credentials, self.identity, run_keys)
        self.dups = Dups(ctx, store, intake, outbound, moments, self._write_replies)
        self._gpus_of = self.ledger.schedule.room.gpus_of  # the GPU ids a run holds
        ledger = self.ledger
        self.handoff = HandOff(self.env, lambda i: i in ledger.schedule or bool(ledger.busy(i)))
        self.limits = RunLimits(ctx, outbound.background, log)
        self.limits.recover()
        self.stops = Stops(ctx, store, log, self.workers, self.limits)  # timeouts, cancels
        self.children = Children(selector, self._on_lines, self._on_exit, closing, ctx, log,
                                 self.stops.deadlines.after, self.starts.children)

    # ------------------------------------------------------------ starting
    def can_start(self) -> bool:
        room = self.ledger.schedule.room
        self.transitions.slots_outside(self.limits.ending)
        return (self.ctx.admin == "UP" and not self.ctx.stopping and self.limits.ready
                and not (self.credentials.refusal or self.identity.refusal)
                and room.has_free_slot() and not self.store.room.check()  # a full disk
                and self._script_ready())

    def next_wait(self) -> float | None:
        """Seconds until a script may start or one must be stopped (its
        timeout); None when nothing waits for time."""
        waits = [w for w in (self._start_wait(), self.stops.deadlines.wait()) if w is not None]
        return min(waits) if waits else None

    def _start_wait(self) -> float | None:
        if self.script_error:
            return self._script_check_at - time.monotonic()
        if self.store.room.full:  # queued ones start once there is room
            return self.store.room.recheck_in() if len(self.ledger.schedule) else None
        if self.can_start():
            due = self.ledger.schedule.next_due()
            if due is not None:
                return due - time.time()
        return None

    def start_due(self) -> None:
        """Start scripts for due messages while workers are free."""
        now = time.time()
        due = self.ledger.schedule.next_due()
        if due is None or due > now:
            return
        if not self.can_start():
            return
        try:  # once a turn, and a stat of the script unless its config changed
            path, argv = self._script.resolve(self.ctx.config["script"],
                                              self.ctx.config["exec_prefix"])
        except SpawnError as exc:
            self._set_script_error(str(exc))
            return
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
            self._conclude(msg_id, msg, Outcome("err", text, kind="timeout"), None)
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
        self._script.forget()  # resolved again before the next start
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
            run = self.env.of_run(msg_id, msg, real, job, self._gpus_of(msg_id))
            for hook in self.moments.starting:
                hook(msg_id, msg, run)
            return run
        except CredentialError as exc:  # named, never their content
            self.log.event("err", str(exc), msg_id, RQ_STATE="run")
            self._conclude(msg_id, msg, Outcome("err", str(exc), kind="err"), None)
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
            self._webhooks(self.transitions.end(msg_id, Outcome("err", text), ""))
            return
        if errno_ == errno.E2BIG:
            exc = SpawnError(f"{exc}: the queue's own environment is too large "
                             f"({spawn.env_problem(self.env.shared(), tuple(argv))})")
        self.transitions.unstart(msg_id, queued, f"SCRIPTERROR: {exc}")
        self._set_script_error(str(exc))

    def _script_ready(self) -> bool:
        """False while a SCRIPTERROR stands (the script missing or not executable, or
        the last start failed for the queue, not the message): checked again
        every SCRIPT_RECHECK seconds."""
        if not self.script_error:
            return True
        if time.monotonic() < self._script_check_at:
            return False
        try:
            script_argv(self.ctx.config["script"], self.ctx.config["exec_prefix"])
        except SpawnError as exc:
            return self._set_script_error(str(exc))
        self.log.event("daemon", "SCRIPTERROR cleared: starts go on")
        self.script_error = ""
        return True

    def _set_script_error(self, why: str) -> bool:
        if not self.script_error:
            self.log.event("err", f"SCRIPTERROR: {why}; messages stay queued")
        self.script_error = why
        self._script_check_at = time.monotonic() + tunables.SCRIPT_RECHECK
        return False

    def reconfigured(self) -> None:
        """After a reload: check a SCRIPTERROR script again now; a new environment."""
        self._script_check_at = 0.0
        self._script.forget()
        self.identity.configure(self.ctx.config)
        self.credentials.configure(self.ctx.config)
        self.env.forget()

    # ------------------------------------------------------------ fd 3 and fd 4
    def _on_lines(self, worker: Worker, lines: list[Command | ProtocolError]) -> None:
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

    # ------------------------------------------------------------ exits
    def _on_exit(self, worker: Worker, wait_status: int) -> None:
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
            self._keep_last_lines(worker.msg_id, outcome)
        self._conclude(worker.msg_id, worker.msg, outcome, worker.on_disk, worker)

    def _keep_last_lines(self, msg_id: str, outcome: Outcome) -> None:
        """Why it failed: its output's last lines beside its status (``observe.lastlines``)."""
        self.output.take_now(msg_id)
        lines = lastlines.of_log(f"{self.store.job_path(msg_id)}/stdio.log")
        if why := self.store.write_last_lines(msg_id, lastlines.encode(lines)):  # [] too:
            self.log.event("warning", why, msg_id)  # an earlier failure's are not this one's
        outcome.last_line = lines[-1] if lines else ""

    def _conclude(self, msg_id: str, msg: Msg, outcome: Outcome, on_disk: str | None,
                  worker: Worker | None = None) -> None:
        """End a run: retried when the queue's policy says so (``retry``)."""
        self.credentials.close_run(msg_id)  # its directory, once all it started is gone
        for hook in self.moments.run_over:
            hook(msg_id, outcome, worker)
        outcome = retried(outcome, msg, self.ctx.config)
        if outcome.state == "que" and (USED in msg or budget(msg, self.ctx.config)):
            outcome.fields[USED] = time_used(worker)
        self._webhooks(self.transitions.end(msg_id, outcome, on_disk))

    def _webhooks(self, ended: list[Ended]) -> None:
        """Call the post_run_webhook of each message that ended."""
        for msg_id, msg, outcome in ended:
            if msg.get("post_run_webhook"):
                self.outbound.webhook(msg_id, msg, outcome)
