"""What every resource needs: the layout, the system config, daemon connections, URLs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import falcon

from rqsys.errors import Forbidden, NotFound
from rqsys.message import message_url
from rqsys.store import Layout, QueueStore, check_msg_id, check_queue_name
from rqsys.web import access
from rqsys.web.auth import acting
from rqsys.web.connections import Connections

if TYPE_CHECKING:
    from rqsys.web.audit import WebAudit


@dataclass
class Web:
    layout: Layout
    sysconfig: dict[str, Any]
    connections: Connections
    audit: WebAudit | None = field(default=None)  # the web's own records (app.create_app)

    @property
    def prefix(self) -> str:
        """``relative_root`` without its trailing slash ("" for "/")."""
        return str(self.sysconfig["relative_root"]).rstrip("/")

    def path(self, *parts: str) -> str:
        """A local link: ``<relative_root>part/part``."""
        return self.prefix + "/" + "/".join(parts)

    def queue_path(self, queue: str) -> str:
        return self.path("q", queue)

    def msg_path(self, queue: str, msg_id: str) -> str:
        return self.path("q", queue, msg_id)

    def msg_url(self, queue: str, msg_id: str) -> str:
        return message_url(self.sysconfig, queue, msg_id)

    def require(self, req: falcon.Request, need: str, queue: str) -> None:
        """Forbidden unless ``req``'s user has role ``need`` on ``queue`` (a second
        queue a request reaches beside its route's); the refusal is audited."""
        try:
            access.account(req).require(need, queue)
        except Forbidden as exc:
            if self.audit is not None:
                self.audit.record(req, f"{req.method} {req.path}", queue, "refused",
                                  error=f"Forbidden: {exc}")
            raise

    def call(self, queue: str, op: str, **args: Any) -> dict[str, Any]:
        """A request to the queue's daemon (socket-activating it under systemd)."""
        return self.connections.call(check_queue_name(queue), op, **args)

    def act(self, req: falcon.Request, queue: str, op: str, **args: Any) -> dict[str, Any]:
        """A request that may change something, made for ``req``'s user: its
        actor (user, address) goes with it, for the daemon's audit trail."""
        return self.call(queue, op, actor=acting(req), **args)

    def existing(self, queue: str) -> str:
        """The queue's name, checked; NotFound when there is no such queue."""
        if not self.layout.queue_dir(check_queue_name(queue)).is_dir():
            raise NotFound(f"no queue named {queue}")
        return queue

    def store(self, queue: str) -> QueueStore:
        """Read-only access to a queue's files (never used to change them)."""
        return QueueStore(self.layout.queue_dir(queue))


def split_suffix(name: str, allowed: tuple[str, ...] = (".json", ".txt")) -> tuple[str, str]:
    """``"foo.json"`` -> ("foo", ".json"); names without a known suffix -> (name, "")."""
    for suffix in allowed:
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


def queue_and_id(queue: str, msg_id: str) -> tuple[str, str]:
    return check_queue_name(queue), check_msg_id(msg_id)


class Resource:
    """Base of the web resources: each is given the shared ``Web`` and nothing else.

    Every GET responder answers HEAD too (``curl -I``, uptime monitors): the
    same answer, whose body falcon leaves out."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            head = "on_head" + name[len("on_get"):]
            if name.startswith("on_get") and not hasattr(cls, head):
                setattr(cls, head, getattr(cls, name))

    def __init__(self, web: Web) -> None:
        self.web = web
