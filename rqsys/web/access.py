"""Roles over HTTP: each request checked against its user's role and queues.

After ``auth.BasicAuth`` has said who the user is, this middleware finds the
role the request needs (``rqsys.wire.roles``): a read needs a viewer (or the
role its resource names as ``read_role``: the audit trail needs an admin); any
other method the role its resource names (``role``: ``operator`` unless it
says ``admin``), on the queue of its route when it has one.  A user whose
``queues`` are not all may use only the routes of those queues and the
dashboard (its list narrowed to them): the pages that show every queue at
once (timers, search, metrics, batches) need a user of all queues.  A
refusal is a 403 naming the role needed; a refused change is told to
``refused`` (the web's audit trail: ``rqsys.web.audit``).  Without ``basic_auth`` the web
is local only, and whoever reaches it is an admin.

The account goes on ``req.context`` and ``resp.context``: the pages show a
user only what it may do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import falcon

from rqsys.errors import Forbidden
from rqsys.wire import roles

READS = ("GET", "HEAD", "OPTIONS")


class Access:
    """falcon middleware: 403 unless the user's role covers the request's."""

    def __init__(self, settings: dict[str, Any] | None,
                 refused: Callable[[falcon.Request, dict[str, Any], str], None] | None = None,
                 ) -> None:
        self.accounts = roles.accounts(settings)
        self.enabled = settings is not None
        self.refused = refused

    def process_resource(self, req: falcon.Request, resp: falcon.Response, resource: Any,
                         params: dict[str, Any]) -> None:
        user = getattr(req.context, "user", None)
        account = self.accounts.get(user or "", roles.ADMIN) if self.enabled else roles.ADMIN
        req.context.account = resp.context.account = account
        if resource is None:
            return
        try:
            self._check(req, account, resource, params)
        except Forbidden as exc:
            if req.method not in READS and self.refused is not None:
                self.refused(req, params, str(exc))
            raise

    def _check(self, req: falcon.Request, account: roles.Account, resource: Any,
               params: dict[str, Any]) -> None:
        need = str(getattr(resource, "read_role", "viewer")) if req.method in READS \
            else str(getattr(resource, "role", "operator"))
        queue = params.get("name")
        if isinstance(queue, str):  # /q/<q>.json, /q/<q>.txt: a queue name has no dot
            queue = queue.split(".", 1)[0]
        if queue is None and account.queues is not None and getattr(resource, "every_queue",
                                                                    False):
            raise Forbidden(f"this shows every queue: it needs a user of all queues "
                            f"(yours: {', '.join(account.queues)})")
        account.require(need, queue if isinstance(queue, str) else None)


def account(req_or_resp: falcon.Request | falcon.Response) -> roles.Account:
    """The request's user (an admin when there is no ``basic_auth``)."""
    return getattr(req_or_resp.context, "account", None) or roles.ADMIN
