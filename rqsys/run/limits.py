"""Per-run limits: a sub-cgroup, a scope or rlimits, and the truth about how a limited run ended.

Only a run with limits comes here; a queue without them pays one dict
look-up a start.  Nothing such a run does may happen before its limits
hold.  One way is chosen at start, and said once in the log:

1. the daemon's own cgroup is delegated (``Delegate=yes``, which rq-scan
   renders for a queue with ``message_limits``): each run gets the
   sub-cgroup ``msg-<id>`` (``rqsys.run.cgroups``); no privilege needed;
2. else, under systemd, a transient scope over D-Bus (``rqsys.run.scopes``:
   a root daemon, or one a polkit rule lets manage units);
3. else rlimits (embedded mode).

In 1 and 2 a run starts through a gate (``sh`` waiting for one line
on fd 4) that opens once its pid is in its sub-cgroup or scope (made on the
``scopes`` lane: the loop never waits on D-Bus or cgroupfs); should that fail, the
gate opens after ``prlimit`` (RLIMIT_AS for memory_max), and from then on
— as without systemd — the spawn sets RLIMIT_AS in the child before exec
and there is no gate.  Said once in the log.  (``runtime_max`` is a timeout of the
runner's.)  At the end the scope is stopped first (everything the script
left behind dies) and the message ends only then, with ``killed: out of
memory (limit 2G)`` when that is what happened.  Peak memory and CPU time
(``wait4``) are in the timeline's ``exit`` event of every run; a
sub-cgroup's own accounting (the whole run, survivors included) in a
``usage`` event.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rqsys.background import Background
from rqsys.daemon.context import QueueContext
from rqsys.daemon.room import as_limits
from rqsys.observe.events import EventLog
from rqsys.run import cgroups, scopes
from rqsys.run import resources as limits_render
from rqsys.run.verdict import Outcome, Worker

LANE = "scopes"
GATE = 'read -r _ <&4 && exec "$@"'  # the script starts once the daemon writes a line


@dataclass
class Run:
    """A limited run's state beside its Worker."""

    worker: Worker
    limits: dict[str, Any]
    scope: str = ""
    cgroup: bool = False  # in a sub-cgroup of the daemon's delegated cgroup
    rlimit_memory: bool = False
    oom: bool = False  # the scope's Result said oom-kill


class RunLimits:
    """The limited runs of one queue daemon."""

    def __init__(self, ctx: QueueContext, background: Background, log: EventLog) -> None:
        self.ctx, self.queue, self.background, self.log = ctx, ctx.name, background, log
        self.cgroups, self._not_delegated = cgroups.find()
        self.systemd = scopes.Systemd() if scopes.available() and not self.cgroups else None
        self.runs: dict[str, Run] = {}
        self.ending = 0  # runs ended whose scope is still being stopped
        self.ready = not (self.systemd or self.cgroups)  # else: once old runs are stopped
        self._said: set[str] = set()
        self._memory_controlled: bool | None = None
        self._unit = self.cgroups.unit if self.cgroups else _own_cgroup()
        self._oom_seen = cgroups.oom_kills(self._unit)  # the unit's OOM kills told so far

    # ------------------------------------------------------------ start-up
    def recover(self) -> None:
        """Stop the scopes a previous daemon left (their messages are back in que)."""
        if self._not_delegated:  # the unit says it delegates: say why that is not used
            self._say_once("cgroup", f"delegated cgroup not found: {self._not_delegated}")
        if self.cgroups is not None:
            self.background.submit(self.cgroups.setup, self._delegated, LANE)
            return
        if self.systemd is None:
            self._say_once("way", "runs with limits get rlimits (no systemd here)")
            return
        prefix = scopes.scope_prefix(self.queue)
        self.background.submit(lambda: self.systemd.stop_all(prefix) if self.systemd else [],
                               self._recovered, LANE)

    def _recovered(self, names: Any, error: BaseException | None) -> None:
        self.ready = True
        if error is not None:
            self._say_once("systemd", f"scopes not used: {error}; rlimits instead")
            self.systemd = None
        else:
            self._say_once("way", "runs with limits get transient scopes over D-Bus")
            if names:
                self.log.event("daemon", f"stopped {len(names)} scope(s) left by the last "
                               "run: " + ", ".join(names))

    def _delegated(self, names: Any, error: BaseException | None) -> None:
        assert self.cgroups is not None
        if error is not None:  # e.g. a process of ours could not be moved
            self.cgroups = None
            self._say_once("way", f"delegated cgroup not usable ({error}): rlimits instead")
            self.ready = True
            return
        self.ready = True
        given = " ".join(sorted(self.cgroups.controllers)) or "none"
        self._say_once("way", f"runs with limits get sub-cgroups of {self.cgroups.unit} "
                       f"(delegated; controllers: {given})")
        if names:
            self.log.event("daemon", f"killed {len(names)} run(s) left by the last daemon: "
                           + ", ".join(names))

    # ------------------------------------------------------------ starting
    def for_message(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The run limits of ``msg`` (empty for most queues)."""
        queue_limits = self.ctx.config.get("message_limits")
        if not (queue_limits or msg.get("limits") or msg.get("needs")):
            return {}
        limits = limits_render.run_limits(queue_limits, msg.get("limits"))
        return limits_render.run_limits(limits, as_limits(msg)) if msg.get("needs") else limits

    def gated(self, path: str, argv: list[str]) -> tuple[str, list[str]]:
        """The program and argv of a limited run: through the gate while a scope
        is to be made; without systemd the script itself (see :meth:`as_limit`)."""
        if self.systemd is None and self.cgroups is None:
            return path, argv
        return "/bin/sh", ["sh", "-c", GATE, "rq-gate", path, *argv[1:]]

    def as_limit(self, limits: dict[str, Any]) -> int:
        """RLIMIT_AS the spawn sets in the child itself (no gate), or -1."""
        if self.systemd or self.cgroups or "memory_max" not in limits:
            return -1
        return limits_render.size_bytes(limits["memory_max"])

    def started(self, worker: Worker, limits: dict[str, Any]) -> None:
        """A gated run has started: hold its limits, then open its gate."""
        run = self.runs[worker.msg_id] = Run(worker, limits)
        if self.cgroups is not None:
            self._make_cgroup(run, self.cgroups)
            return
        if self.systemd is None:  # not gated: the spawn set RLIMIT_AS in the child
            run.rlimit_memory = "memory_max" in limits
            self._say_fallback()
            return
        run.scope = scopes.scope_name(self.queue, worker.msg_id)
        props = scopes.properties(worker.child.pid, limits, self.ctx.config["stop_grace"])
        self.background.submit(lambda: self._make_scope(run, props),
                               lambda _r, error: self._scoped(run, error), LANE)

    def _make_cgroup(self, run: Run, delegation: cgroups.Delegation) -> None:
        msg_id, pid = run.worker.msg_id, run.worker.child.pid
        run.cgroup = True
        self.background.submit(lambda: delegation.start(msg_id, pid, run.limits),
                               lambda _r, error: self._in_cgroup(run, error), LANE)

    def _in_cgroup(self, run: Run, error: BaseException | None) -> None:
        if error is not None:  # the run goes on, with rlimits; its cgroup (if made) is killed
            self.log.event("err", f"{error}: the run has rlimits instead", run.worker.msg_id)
        elif self.cgroups is not None and not self.cgroups.holds("memory_max"):
            self._say_once("memory", "no memory controller in the delegated cgroup (cgroup "
                           "v1 holds it?): memory_max is held by RLIMIT_AS instead")
        memory = self.cgroups is None or not self.cgroups.holds("memory_max")
        self._open(run, rlimits=error is not None or memory)

    def _make_scope(self, run: Run, props: list[tuple[str, Any]]) -> None:
        """On the lane: the scope, and whether its memory limit can hold."""
        assert self.systemd is not None
        self.systemd.start(run.scope, props)
        if "memory_max" in run.limits and self._memory_controlled is None:
            self._memory_controlled = self.systemd.memory_controlled(run.scope)

    def _scoped(self, run: Run, error: BaseException | None) -> None:
        if error is not None:
            self._say_once("systemd", f"no scope for runs ({error}): rlimits and the "
                           "daemon's timer instead")
            self.systemd, run.scope = None, ""
        elif "memory_max" in run.limits and self._memory_controlled is False:
            self._say_once("memory", "systemd has no memory controller here (cgroup v1 "
                           "mounted read-only?): memory_max is held by RLIMIT_AS instead")
        rlimits = error is not None or self._memory_controlled is False
        self._open(run, rlimits=rlimits)

    def _open(self, run: Run, rlimits: bool) -> None:
        """Apply the rlimits (when they stand in for systemd) and open the gate."""
        child = run.worker.child
        if rlimits and "memory_max" in run.limits:
            run.rlimit_memory = self._prlimit(child.pid, limits_render.size_bytes(
                run.limits["memory_max"]))
        if rlimits and self.systemd is None and self.cgroups is None:
            self._say_fallback()
        if run.worker.msg_id in self.runs and child.reply_w not in child.closed:
            with contextlib.suppress(OSError):  # the gate has died (the run was killed)
                os.write(child.reply_w, b"\n")

    def _say_fallback(self) -> None:
        self._say_once("fallback", "runs are limited without systemd: memory_max by "
                       "RLIMIT_AS, runtime_max by the daemon's timer; cpu_quota and "
                       "tasks_max are not held")

    def _prlimit(self, pid: int, size: int) -> bool:
        try:
            resource.prlimit(pid, resource.RLIMIT_AS, (size, size))
        except OSError as exc:  # a seccomp filter without @resources, say
            self._say_once("prlimit", f"cannot set RLIMIT_AS on runs: {exc}")
            return False
        return True

    def _say_once(self, key: str, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.log.event("daemon", text)

    # ------------------------------------------------------------ ending
    def tracks(self, msg_id: str) -> bool:
        return msg_id in self.runs

    def finish(self, worker: Worker, then: Callable[[Run], None]) -> None:
        """The run's script has ended: stop its scope, then ``then(run)`` (the
        run with what ended it, for :func:`explain`)."""
        run = self.runs.pop(worker.msg_id)
        if run.cgroup and self.cgroups is not None:
            self._end_cgroup(run, self.cgroups, then)
            return
        if not run.scope or self.systemd is None:
            then(run)
            return
        self.ending += 1
        systemd = self.systemd
        self.background.submit(lambda: systemd.stop(run.scope),
                               lambda result, error: self._stopped(run, result, error, then),
                               LANE)

    def _end_cgroup(self, run: Run, delegation: cgroups.Delegation,
                    then: Callable[[Run], None]) -> None:
        self.ending += 1
        msg_id = run.worker.msg_id
        self.background.submit(lambda: delegation.stop(msg_id),
                               lambda usage, error: self._emptied(run, usage, error, then), LANE)

    def _emptied(self, run: Run, usage: Any, error: BaseException | None,
                 then: Callable[[Run], None]) -> None:
        self.ending -= 1
        msg_id = run.worker.msg_id
        if error is not None:
            self.log.event("err", f"run's cgroup not removed: {error}", msg_id)
        else:
            run.oom = usage.oom_kills > 0
            self.log.record("usage", msg_id, RQ_STATE="run", **usage.fields())
        then(run)

    def _stopped(self, run: Run, result: Any, error: BaseException | None,
                 then: Callable[[Run], None]) -> None:
        self.ending -= 1
        if error is not None:
            self.log.event("err", f"scope {run.scope} not stopped: {error}", run.worker.msg_id)
        elif result == "oom-kill":
            run.oom = True
        then(run)


    def queue_oom(self, outcome: Outcome) -> Outcome:
        """A run SIGKILLed by the OOM killer at the queue's own ``memory_max``
        (MemoryMax= of rq@<q>): said so.  Each new OOM kill of the unit
        explains one such end."""
        limit = (self.ctx.config.get("limits") or {}).get("memory_max")
        if not limit or outcome.state != "err" or outcome.kind != "signal" \
                or "SIGKILL" not in outcome.text:
            return outcome
        if cgroups.oom_kills(self._unit) <= self._oom_seen:
            return outcome
        self._oom_seen += 1
        return Outcome("err", f"killed: out of memory (queue limit {limit})", kind="signal")


def _own_cgroup() -> Any:
    try:
        return cgroups.own_cgroup()
    except OSError:
        return None


def explain(run: Run, outcome: Outcome) -> Outcome:
    """The outcome of a limited run as it truly was."""
    if outcome.state != "err" or outcome.kind in ("timeout", "err"):
        return outcome  # ended well, destroyed, stopped, timed out, or said why itself
    if run.oom:
        return Outcome("err", "killed: out of memory ("
                       + limits_render.describe_memory(run.limits) + ")", kind="signal")
    if run.rlimit_memory:
        return Outcome("err", f"{outcome.text} (memory_max {run.limits['memory_max']} is "
                       "RLIMIT_AS here: an allocation past it fails)", kind=outcome.kind)
    return outcome
