"""Whether the queue's script can be started: SCRIPTERROR, found, said and checked again."""

from __future__ import annotations

import time

from rqsys import tunables
from rqsys.daemon.context import QueueContext
from rqsys.errors import SpawnError
from rqsys.observe.events import EventLog
from rqsys.run.spawn import ScriptPath, script_argv


class ScriptCheck:
    """The queue's script, resolved once a turn; a SCRIPTERROR while it cannot run."""

    def __init__(self, ctx: QueueContext, log: EventLog) -> None:
        self.ctx, self.log = ctx, log
        self.error = ""  # why the script cannot be started (SCRIPTERROR), or ""
        self.check_at = 0.0
        self.path = ScriptPath()

    def resolve(self) -> tuple[str, list[str]] | None:
        """The script's path and argv (a stat, unless its config changed); None:
        a SCRIPTERROR now."""
        try:
            return self.path.resolve(self.ctx.config["script"], self.ctx.config["exec_prefix"])
        except SpawnError as exc:
            self.fail(str(exc))
            return None

    def wait(self) -> float:
        """Seconds until a SCRIPTERROR is checked again."""
        return self.check_at - time.monotonic()

    def reconfigured(self) -> None:
        """After a reload: check a SCRIPTERROR script again now."""
        self.check_at = 0.0
        self.path.forget()

    def ready(self) -> bool:
        """False while a SCRIPTERROR stands (the script missing or not executable, or
        the last start failed for the queue, not the message): checked again
        every SCRIPT_RECHECK seconds."""
        if not self.error:
            return True
        if time.monotonic() < self.check_at:
            return False
        try:
            script_argv(self.ctx.config["script"], self.ctx.config["exec_prefix"])
        except SpawnError as exc:
            return self.fail(str(exc))
        self.log.event("daemon", "SCRIPTERROR cleared: starts go on")
        self.error = ""
        return True

    def fail(self, why: str) -> bool:
        if not self.error:
            self.log.event("err", f"SCRIPTERROR: {why}; messages stay queued")
        self.error = why
        self.check_at = time.monotonic() + tunables.SCRIPT_RECHECK
        return False
