"""What every room of the daemon reads about its queue: name, config, admin state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rqsys import config
from rqsys.daemon.adminfiles import AdminFiles, stricter
from rqsys.errors import BadRequest, QueueDown
from rqsys.message import is_remote, message_url
from rqsys.special import RELAY_QUEUE
from rqsys.store import Layout
from rqsys.wire.client import local_queue_of, queue_for_dest


@dataclass
class QueueContext:
    """The queue a daemon serves, as the loop last read it (a reload replaces
    ``config`` and ``sysconfig``; an adminoper changes ``admin_oper``, RQ's
    admin files ``admin_files``; see ``adminfiles``)."""

    layout: Layout
    name: str
    sysconfig: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    admin_oper: str = "UP"  # rqsys's own, durable: rq adminoper down|pause|up|resume
    admin_files: str = "UP"  # RQ's config/<q>.down and config/<q>.pause, as last read
    stopping: bool = False
    files: AdminFiles | None = None
    _url_prefix: tuple[Any, str] = field(default=(None, ""), init=False, repr=False,
                                         compare=False)  # (the sysconfig it is of, the prefix)

    @classmethod
    def load(cls, layout: Layout, name: str) -> QueueContext:
        ctx = cls(layout, name, config.load_system_config(layout, layout.queue_dir(name)),
                  config.load_queue_config(layout, name, memo=True))
        ctx.files = AdminFiles(layout.config_file.parent, name)
        ctx.refresh_admin()
        return ctx

    @property
    def admin(self) -> str:
        """UP, PAUSE or DOWN: the stricter of rqsys's admin state and RQ's files."""
        return stricter(self.admin_oper, self.admin_files)

    def refresh_admin(self) -> str:
        """Read RQ's admin files again (two stats); the admin state now."""
        if self.files is not None:
            self.admin_files = self.files.state()
        return self.admin

    def reload(self) -> None:
        """Re-read both configs; on an error (RQError) the old ones stay."""
        cfg = config.load_queue_config(self.layout, self.name, memo=True)
        self.sysconfig = config.load_system_config(self.layout, self.layout.queue_dir(self.name))
        self.config = cfg

    def url(self, msg_id: str) -> str:
        """A message's full id: its URL (the part before the id made once per
        system config: a run asks three times)."""
        made = self._url_prefix
        if made[0] is not self.sysconfig:
            made = self._url_prefix = (self.sysconfig,
                                       message_url(self.sysconfig, self.name, ""))
        return made[1] + msg_id

    def check_accepting(self, strict: bool = False) -> None:
        """QueueDown unless new messages are taken (``strict``: not when PAUSEd either).
        RQ's admin files are read again unless their watch holds (see adminfiles)."""
        if self.files is None or not self.files.watching:
            self.refresh_admin()
        if self.stopping:
            raise QueueDown(f"queue {self.name} is stopping")
        if self.admin == "DOWN" or (strict and self.admin == "PAUSE"):
            raise QueueDown(f"queue {self.name} is {self.admin}")

    def check_dest(self, msg: dict[str, Any],
                   may_send: Callable[[str], None] | None = None) -> None:
        """BadRequest unless ``msg`` is for this queue (a relay takes remote ones);
        a URL naming this queue on this host becomes its plain name.  The relay
        takes a URL naming another queue of this host only if ``may_send`` (who
        asks: ``Request.require_on``) does not refuse that queue."""
        dest = msg["dest"]
        remote = is_remote(dest) or msg.get("force_remote")
        if remote and self.name == RELAY_QUEUE:
            # a plain name forced remote is relayed to this host's queue of that name
            local = local_queue_of(dest, self.sysconfig) if is_remote(dest) else dest
            if local is not None and may_send is not None:
                may_send(local)
            return
        if dest == self.name:
            return
        if local_queue_of(dest, self.sysconfig) == self.name:
            msg["dest"] = self.name
            return
        raise BadRequest(f"dest {dest!r} is not queue {self.name}")

    @staticmethod
    def dup_target(dest: str) -> str:
        """The local queue that takes a script's ``dup`` to ``dest``: RQ's rule,
        any URL (this host's too) goes to the relay queue, a name to that queue."""
        return queue_for_dest(dest)
