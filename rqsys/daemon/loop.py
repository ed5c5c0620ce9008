"""The daemon's event loop: start-up, the fixed phases of a turn, idle, stop,
reload and the STATUS= line (supervisor's ``runforever`` shape).

A turn: wait in the selector (listening socket, client connections, each
script's status pipe and pidfd, the signal wake-up socket, the background
threads' wake-up pipe) until the next due message or timer; run what is
ready; publish the turn's new messages in one group commit and answer their
clients; act on signal flags; start due messages; flush the batched
directory fsyncs (at most every ``store.FLUSH_INTERVAL``); tell systemd.
Signal handlers only set flags.
"""

from __future__ import annotations

import selectors
import signal
import socket
import time
from collections.abc import Mapping
from typing import Any

from rqsys import tunables
from rqsys.background import PRUNE, SYNC, Background, peer_lane
from rqsys.batches.ends import BatchEnds
from rqsys.daemon import observe, ops
from rqsys.daemon.after import After
from rqsys.daemon.audit import Auditor
from rqsys.daemon.context import QueueContext
from rqsys.daemon.features import Features
from rqsys.daemon.gates import Gate
from rqsys.daemon.intake import Intake
from rqsys.daemon.loopclock import LoopClock
from rqsys.daemon.observe import Observer
from rqsys.daemon.outbound import Outbound
from rqsys.daemon.queload import QueLoad
from rqsys.daemon.room import Room
from rqsys.daemon.scheduler import Schedule
from rqsys.daemon.server import Handler, Server
from rqsys.daemon.transitions import Ledger, Transitions
from rqsys.errors import RQError
from rqsys.fdclose import FdBatch
from rqsys.observe.events import EventLog
from rqsys.run.output import ScriptOutput
from rqsys.run.runner import Runner
from rqsys.signals import STOP_SIGNALS, SignalFlags
from rqsys.special import WEBHOOK_QUEUE
from rqsys.store import Layout, QueueStore, dirsync
from rqsys.systemd import Notifier, default_idle_timeout
from rqsys.unixsock import listen_unix
from rqsys.wire import schema

ExtraOps = Mapping[str, tuple[Handler, dict[str, Any]]]
WEBHOOK_LANE = peer_lane(WEBHOOK_QUEUE)
UNORDERED_DISK = ("the store is on ext4 without a journal, on a disk with a volatile write "
                  "cache: a power cut can lose messages moved just before it; put it on "
                  "a journalling file system (docs/DURABILITY.md)")


class QueueDaemon:
    """One queue's daemon: builds the rooms and runs the loop.

    ``extra_ops`` adds operations to the socket protocol, each a handler and
    the JSON Schema of its requests (``{"op": (handler, schema)}``): the
    hook through which tests register an op that fails on purpose.
    """

    stopping_until: float | None  # a stop's deadline, once asked

    def __init__(self, layout: Layout, name: str, listener: socket.socket | None = None,
                 notifier: Notifier | None = None, log: EventLog | None = None,
                 extra_ops: ExtraOps | None = None) -> None:
        self.ctx = QueueContext.load(layout, name)
        self.notifier = notifier or Notifier()
        self.log = log or EventLog(name)
        self.log.batched = True  # written once a turn: see _end_turn
        self.features = Features(self.ctx, self.log)  # the optional ones its config asks for
        self.moments = self.features.moments
        self.store = QueueStore(layout.queue_dir(name), ids=self.features.ids)
        self.default_idle = default_idle_timeout()
        self.selector = selectors.DefaultSelector()
        self.background = Background()
        self._build_state()
        self._build_run(layout, name)
        self.server = self._server(extra_ops or {})
        self.listener, self.stopping_until = listener, None
        self.idle_since = time.monotonic()
        self._status_sent, self._status_stale, self._status_at = "", False, 0.0

    def _build_state(self) -> None:
        """The ledger and its writers: the transitions, the dependencies, the intake."""
        moments = self.moments
        schedule = Schedule(self.ctx.config["blocking_params"], self.ctx.config["coalesce_params"],
                            Gate.from_config(self.ctx.config), Room(self.ctx.config),
                            self.ctx.config["reserve_after"])
        whole = self.ctx.config["coalesce_params"] or self.ctx.config.get("pool")
        self.ledger = Ledger(self.store, schedule, self.log, moments,  # a deep que's tail:
                             0 if whole else tunables.QUE_WINDOW)  # rqsys.daemon.quetail
        moments.register(self.ledger.unique, "unique")
        self.transitions = Transitions(
            self.ledger, lambda work, then: self.background.submit(work, then, SYNC),
            lambda work, then: self.background.submit(work, then, PRUNE))
        self.queload = QueLoad(self.transitions)  # que/ read in a slice a turn after start
        self.after = After(self.ctx, self.store, self.transitions, self.log, self.selector,
                           self.background)
        moments.register(self.after, "after")
        self.intake = Intake(self.ctx, self.store, self.transitions, self.background, self.log,
                             self.after, moments)

    def _build_run(self, layout: Layout, name: str) -> None:
        """The runner and what watches the runs; a pool queue's member last (it
        pulls into the intake and runs through the runner)."""
        moments = self.moments
        self.clock = LoopClock()
        self.closing = FdBatch()  # a turn's ended runs' fds, closed when it ends: neighbours
        self.observer = Observer(self.ctx, self.store, self.transitions, self.background, self.log,
                                 self.clock, self.closing)
        self.batch_ends = BatchEnds(layout, name, self.background, self.log,
                                    bool(self.ctx.config.get("pool")))
        self.runner = Runner(self.ctx, self.store, self.transitions, self.selector,
                             ScriptOutput(name, self.selector, self.log.journal), self.log,
                             self.intake, Outbound(self.ctx, self.store, self.background,
                                                   self.log), self.clock, self.closing,
                             moments, self.features.run_keys)
        self.stops = self.runner.stops  # the scripts' timeouts, and the stop's TERM and KILL
        self.features.register_late(self.store, self.transitions, self.intake, self.runner,
                                self.batch_ends)

    def _server(self, extra_ops: ExtraOps) -> Server:
        handlers = ops.Ops(self.ctx, self.store, self.transitions, self.runner, self.background,
                           self.log, self.reload, self.status_line)
        table, schemas = ops.table(handlers, self.intake), dict(schema.OPS)
        for hook in self.moments.building_ops:
            hook(table, schemas)
        table.update(self.observer.ops())
        schemas.update(observe.SCHEMAS)
        for op, (handler, op_schema) in extra_ops.items():
            table[op], schemas[op] = handler, op_schema
        self.auditor = Auditor(self.ctx.layout.audit_dir, self.ctx.name, self.background,
                               self.log, self.store.room)
        return Server(self.ctx.name, self.selector, table, schemas, self.log,
                      self.auditor.answered, self.auditor.require_room)

    # ---------------------------------------------------------------- start-up
    def start(self) -> None:
        """Recover the store, load que/, open the socket, then tell READY=1."""
        self.observer.load()
        self.queload.start()  # its moments only while it reads (QueLoad.NAME)
        self.batch_ends.recover(self.store, self.queload.que_ids)
        self._warn_unordered_disk()
        self.ctx.admin_oper = self.store.admin_state()
        if self.moments.joining:  # what joins (a pool queue) hands back the whole que
            self.queload.read()
        for hook in self.moments.joining:  # a pool queue joins its pool, or says why not
            hook(self.selector)
        self.server.listen(self.listener or listen_unix(
            self.ctx.layout.socket_path(self.ctx.name)))
        self.signals = SignalFlags()
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.selector.register(self.signals, selectors.EVENT_READ, self.signals.drain)
        self.selector.register(self.background, selectors.EVENT_READ,
                               lambda _key, _mask: self.background.run_finished())
        if self.ctx.files is not None:
            self.ctx.files.watch(self.selector, self._admin_files_changed)
            self.ctx.refresh_admin()  # a file made before the watch began
        # the listener, signals, background pipe, admin files' watch: more are clients, scripts
        self.always_registered = len(self.selector.get_map())
        self.notifier.ready(self.status_line())
        self.observer.index_after_ready()
        self.log.flush()  # start-up's events (recovered, ...), before the first wait

    def _warn_unordered_disk(self) -> None:
        """Say once when renames are ordered by ``chattr +D`` on a disk whose
        volatile cache may reorder them in a power cut (docs/DURABILITY.md)."""
        if self.store.ordered and dirsync.volatile_write_cache(self.store.qdir):
            self.log.event("warning", UNORDERED_DISK)

    # ---------------------------------------------------------------- the loop
    def run(self) -> int:
        self.start()
        try:
            while self._turn():
                pass
        finally:
            self.log.flush()  # a turn an exception ended: its lines written first
        self._shut_down()
        return 0

    def _turn(self) -> bool:
        """One turn of the loop; False when the daemon should stop."""
        timeout = self._timeout()
        began = time.perf_counter()
        events = self.selector.select(timeout)
        self.clock.idle_s += time.perf_counter() - began
        files = self.ctx.files
        if len(events) > 1 and files is not None and files.watching:  # admin files' news first
            events.sort(key=lambda event: event[0].fd != files.fd)
        for key, mask in events:
            key.data(key, mask)
        self.intake.publish_pending()
        self.server.resume_accepting()
        self.stops.deadlines.fire()  # the scripts whose timeout has come
        self.after.settle()  # dependencies' ends: waiting messages released or failed
        if self._handle_flags():
            return False
        for hook in self.moments.turn:  # a pool's: pull for free workers, ack ends, extend runs
            hook()
        self.runner.start_due()
        self._end_turn()
        if self._idle_expired():
            self.log.event("daemon", "idle: exiting until the next request")
            return False
        return True

    def _end_turn(self) -> None:
        """The turn's batched writes, before the loop waits again: the
        directory syncs when due, the events' lines (timelines, stats, log)."""
        self.store.flush()
        self.observer.file.tick(time.monotonic())
        self.observer.copies.tell()  # a copy's failed writes, once per change
        self.log.flush()
        self.closing.close()  # after the timelines' flush: a run's fds in one close_range
        self._report()

    def _shut_down(self) -> None:
        if self.ctx.files is not None:
            self.ctx.files.close(self.selector)
        self.store.spares.close()
        self.after.close()
        self.background.close()
        self.auditor.close()
        self.observer.close()
        self.runner.output.close_all()
        self.runner.starts.close()
        if self.runner.children.leftovers is not None:  # what ignored TERM: not left to init
            self.runner.children.leftovers.kill_now()
        self.store.flush(force=True)
        for hook in self.moments.closing:  # a pool's acks and hand-back, the spans not sent
            hook()
        que = self.ledger.schedule
        if len(que) >= tunables.SNAPSHOT_MIN and not self.ledger.on_disk_only:  # else as a crash
            self.store.save_que_snapshot(que.msgs)
        self.notifier.stopping()
        self.log.flush()
        self.closing.close()

    def _timeout(self) -> float:
        if self.intake.pending or self.after.ended:  # taken in after this turn's phase
            return 0.0
        now = time.monotonic()
        waits = [tunables.LONGEST_WAIT, self.runner.next_wait(), self.store.flush_due(),
                 self.intake.place_wait(),
                 self.notifier.watchdog_due(now), self.server.next_wait(),
                 *(wait() for wait in self.moments.wait)]
        if self._status_stale:
            waits.append(self._status_at - now)
        if self.stopping_until is not None:
            waits.append(min(tunables.STOP_POLL, self.stopping_until - now))
        idle = self._idle_timeout()
        if idle and self._is_idle():
            waits.append(self.idle_since + idle - now)
        return max(0.0, min(w for w in waits if w is not None))

    def _report(self) -> None:
        """STATUS= to systemd when it changed, at most every STATUS_INTERVAL."""
        now = time.monotonic()
        if now < self._status_at:  # made when due, not at every turn of a busy loop
            self._status_stale = True
        else:
            line = self.status_line()
            self._status_stale = line != self._status_sent
            if self._status_stale:
                self.notifier.status(line)
                self._status_sent, self._status_stale = line, False
                self._status_at = now + tunables.STATUS_INTERVAL
        self.notifier.kick_watchdog(now)

    def status_line(self) -> str:
        count = self.ledger.count
        text = (f"que {count('que')}, run {count('run')}/{self.ctx.config['num_workers']}, "
                f"done {count('done')}, err {count('err')}")
        if self.runner.script_error:
            return f"SCRIPTERROR ({self.runner.script_error}): {text}"
        return text if self.ctx.admin == "UP" else f"{self.ctx.admin}: {text}"

    # ---------------------------------------------------------------- idle
    def _is_idle(self) -> bool:
        busy = (self.runner.workers or self.ledger.count("que") or self.intake.pending
                or self.intake.unplaced  # answered ok, not in que/ yet (a full disk)
                or self.background.busy() or any(busy() for busy in self.moments.busy)
                or self.server.next_wait() is not None)  # clients wait to be accepted
        others = len(self.selector.get_map()) > self.always_registered  # clients, scripts
        return not busy and not others and self.stopping_until is None

    def _idle_timeout(self) -> float:
        """The queue's own idle_timeout, else the unit's RQ_IDLE_TIMEOUT."""
        return float(self.ctx.config["idle_timeout"] or self.default_idle)

    def _idle_expired(self) -> bool:
        idle = self._idle_timeout()
        if not self._is_idle():
            self.idle_since = time.monotonic()
            return False
        return bool(idle) and time.monotonic() - self.idle_since >= idle

    # ---------------------------------------------------------------- signals
    def _handle_flags(self) -> bool:
        """Act on signals; True when the loop should end."""
        flags = self.signals.take()
        if signal.SIGHUP in flags:
            self.reload()
        if flags & STOP_SIGNALS and self.stopping_until is None:
            self._begin_stop()
        if self.stopping_until is None:
            return False
        if self.runner.workers and time.monotonic() >= self.stopping_until:
            self.stops.kill_all()
        return self._settled()

    def _settled(self) -> bool:
        """Nothing is left that must end before the daemon does: scripts, the
        syncs an answer or a move waits for, a prune, webhook calls.  (Dups to other
        queues and attachments being hashed are dropped: their scripts and
        clients are gone, and nothing of theirs was stored.)"""
        return not self.runner.workers and not self.background.busy(SYNC, PRUNE, WEBHOOK_LANE)

    def _begin_stop(self) -> None:
        self.log.event("daemon", f"stopping; {len(self.runner.workers)} script(s) told to stop")
        self.notifier.stopping()
        self.stopping_until = time.monotonic() + float(self.ctx.config["stop_grace"])
        self.ctx.stopping = True
        self.server.stop_listening()
        self.stops.stop_all()

    def _admin_files_changed(self) -> None:
        """inotify saw a change in config/: RQ's admin files are read again (the
        turn then starts what a resumed queue may run)."""
        before = self.ctx.admin
        if self.ctx.refresh_admin() != before:
            self.log.event("daemon", f"admin state {self.ctx.admin} (RQ's admin files: "
                           f"{self.ctx.admin_files}, adminoper: {self.ctx.admin_oper})")

    def reload(self) -> None:
        """Re-read the queue config; running scripts are not disturbed."""
        self.notifier.reloading()
        try:
            self.ctx.reload()
        except RQError as exc:
            self.log.event("err", f"reload failed, keeping the old config: {exc}")
        else:
            self.transitions.reconfigure(Gate.from_config(self.ctx.config), self.ctx.config)
            self.runner.reconfigured()
            self.log.event("daemon", "configuration reloaded")
        self.notifier.send("READY=1")
