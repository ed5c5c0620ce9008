"""One running queue script: its status lines, and the verdict when it ends.

Exit rules (RQ's ``handle_child_close``): ``err`` is err whatever the exit;
any other ending with a non-zero status or a signal is err with RQ's text
``PROCESS EXITED IMPROPERLY - MOVING TO ERR - Completion was <done|resend|
relayed|> but exit status was pid <pid> exit <n>`` (Ruby's Process::Status);
``done`` and ``relayed`` end there; ``resend`` raises the count (RQ's
``RQ_COUNT``: 0 on the first run, one more per resend) and goes back to que,
unless the raised count reached max_count: then err, ``HIT MAX RESEND COUNT -
MOVING TO ERR`` (and, unlike RQ, `` - <the resend's text>``); exiting 0
without any of them is err.  The last terminal line wins.
"""

from __future__ import annotations

import collections
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from rqsys.errors import ProtocolError
from rqsys.run.protocol import Command, parse_line
from rqsys.run.spawn import Child

MAX_LINE = 64 * 1024  # longer status lines are cut here; the command still counts
READ_SIZE = 65536  # a pipe's whole buffer


@dataclass
class Outcome:
    """Where a finished message goes, with its status text."""

    state: str  # done | err | relayed | que | deleted
    text: str
    delay: float = 0
    recount: int = 0  # added to the message's count: 1 after a resend (RQ's count)
    kind: str = ""  # why a failure failed (a retry's "on"): err, exit, signal, timeout
    fields: dict[str, Any] = field(default_factory=dict)  # set in the msg (retries, ...)
    last_line: str = ""  # of what the run wrote, when it ended in err (rqsys.observe.lastlines)
    tail: list[str] = field(default_factory=list)  # its last few lines, in this run's record


@dataclass
class Worker:
    msg_id: str
    msg: dict[str, Any]
    child: Child
    started: float = field(default_factory=time.time)
    terminal: Command | None = None
    status: str = ""
    on_disk: str | None = None  # what its status file holds now, when known
    stop_reason: str = ""  # "stopping" (daemon stop), "destroy", "timeout" or "cancel"
    stop_text: str = ""  # the status a "timeout" ends with
    rusage: Any = None  # os.wait4's resource usage, once reaped
    wait_status: int | None = None  # os.wait4's, once reaped
    _buf: bytearray = field(default_factory=bytearray)
    _cutting: bool = False
    _replies: collections.deque[list[str]] = field(default_factory=collections.deque)

    def expect_reply(self) -> list[str]:
        """A place for the answer to a ``dup``, filled (with one line) when it comes."""
        slot: list[str] = []
        self._replies.append(slot)
        return slot

    def ready_replies(self) -> list[str]:
        """Answers to write on fd 4 now: the script reads them in the order it
        asked, so one that came early waits for those asked before it."""
        ready = []
        while self._replies and self._replies[0]:
            ready.append(self._replies.popleft()[0])
        return ready

    def read_lines(self) -> tuple[list[Command | ProtocolError], bool]:
        """Read what the script wrote on fd 3: (parsed lines, eof)."""
        results: list[Command | ProtocolError] = []
        eof = False
        while True:
            try:
                data = os.read(self.child.status_r, READ_SIZE)
            except BlockingIOError:
                break
            if not data:
                eof = True
                break
            results.extend(self._feed(data))
            if len(data) < READ_SIZE:
                break  # the pipe is empty now: no read just to hear EAGAIN
        return results, eof

    def _feed(self, data: bytes) -> list[Command | ProtocolError]:
        out: list[Command | ProtocolError] = []
        *complete, tail = data.split(b"\n")
        for piece in complete:
            out.extend(self._line(piece))
        self._append(tail)
        return out

    def _line(self, piece: bytes) -> list[Command | ProtocolError]:
        self._append(piece)
        line, cut = bytes(self._buf), self._cutting
        self._buf.clear()
        self._cutting = False
        try:
            parsed: list[Command | ProtocolError] = [parse_line(line)]
        except ProtocolError as exc:
            parsed = [exc]
        if cut:
            parsed.append(ProtocolError(f"status line longer than {MAX_LINE} bytes was cut"))
        return parsed

    def _append(self, data: bytes) -> None:
        room = MAX_LINE - len(self._buf)
        if len(data) > room:
            self._cutting = True
            data = data[:max(room, 0)]
        self._buf += data

    def verdict(self, wait_status: int, max_count: int) -> Outcome:
        """Where the message goes now that the script has ended."""
        if self.stop_reason == "destroy":
            return Outcome("deleted", "destroyed")
        if self.stop_reason == "stopping":
            return Outcome("que", "requeued: the queue daemon stopped")
        if self.stop_reason in ("timeout", "cancel"):  # a cancel is not retried: no "on" has it
            return Outcome("err", self.stop_text, kind=self.stop_reason)
        if getattr(self.child, "lost", False):  # a relay the relay worker dropped (handoff)
            return Outcome("que", "requeued: the relay worker went away; the next run "
                           "starts the relay script")
        cmd = self.terminal
        if cmd is not None and cmd.kind == "err":
            return Outcome("err", cmd.text, kind="err")
        if cmd is None and self.child.status_lost:
            return Outcome("err", f"{self._process()} ended without sending done; its exit "
                           "status was lost (reaped before its start was answered)",
                           kind="exit")
        if wait_status != 0:
            return Outcome("err", improper_exit(cmd.kind if cmd else "", self._process(),
                                                wait_status),
                           kind="signal" if os.WIFSIGNALED(wait_status) else "exit")
        if cmd is None:
            return Outcome("err", "script exited 0 without sending done", kind="exit")
        if cmd.kind == "resend":
            if int(self.msg.get("count", 0)) + 1 >= max_count:
                said = f" - {cmd.text}" if cmd.text else ""  # why it wanted to resend
                return Outcome("err", f"HIT MAX RESEND COUNT - MOVING TO ERR{said}", recount=1)
            return Outcome("que", cmd.text, delay=cmd.due, recount=1)
        return Outcome(cmd.kind, cmd.text)

    def _process(self) -> str:
        """Who ran it, as RQ's exit texts name it: ``pid N``, or a relay
        worker's hand-over (rqsys.run.handoff: no process of its own)."""
        return self.child.process or f"pid {self.child.pid}"


def improper_exit(completion: str, process: str, wait_status: int) -> str:
    """RQ's status text for a script that ended badly without sending ``err``
    (``exit_status`` there is a Ruby Process::Status: ``pid N exit N`` or
    ``pid N SIGNAME (signal N)``; ``process`` is its ``pid N``)."""
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        core = " (core dumped)" if os.WCOREDUMP(wait_status) else ""
        status = f"{process} {signal.Signals(sig).name} (signal {sig}){core}"
    else:
        status = f"{process} exit {os.waitstatus_to_exitcode(wait_status)}"
    return (f"PROCESS EXITED IMPROPERLY - MOVING TO ERR - Completion was {completion} "
            f"but exit status was {status}")
