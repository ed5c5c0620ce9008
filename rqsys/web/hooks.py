"""``POST /hooks/<name>``: a signed webhook delivery makes one message; ``/triggers.json``.

The route takes no basic auth and passes the Host and CSRF checks
(``rqsys.web.auth.signed_hook``): the signature is the authentication.
In order: the trigger file (404 without one, 503 when it is refused), the
body (413 over ``max_body``: at most ``max_body + 1`` bytes are read), the
secret (503 when it cannot be read) and the signature over the raw body
(401: nothing is made), the queue (503 when there is none), then the
create, through the queue daemon's socket as every web create, acting as
``trigger <name>`` (its timeline and the daemon's audit trail name it).  A
delivery id seen before is answered with the message it made, 200 and
``RQ-Duplicate: true``, as ``new_message`` answers a held unique key.
Each outcome is counted in the trigger's record (``rqsys.triggers.record``);
each refusal is also a line on the web's standard error.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import falcon

from rqsys.errors import NotFound, RQError, TooLarge
from rqsys.triggers import listing, record, spec, webhook
from rqsys.triggers.secrets import SecretUnreadable
from rqsys.triggers.signatures import BadSignature
from rqsys.web.context import Resource, Web
from rqsys.web.queues import DUPLICATE_HEADER


class Hook(Resource):
    """``POST /hooks/<name>``: one message per signed delivery."""

    def __init__(self, web: Web) -> None:
        super().__init__(web)
        self.triggers = spec.Cache(web.layout)
        self.where = spec.triggers_dir(web.layout)

    def on_post(self, req: falcon.Request, resp: falcon.Response, trigger: str) -> None:
        found = self._trigger(trigger)
        delivery = webhook.Delivery(self._body(req, found), req.content_type or "",
                                    req.get_header)
        try:
            webhook.check(found, delivery)
        except SecretUnreadable as exc:
            self._refuse(trigger, str(exc), falcon.HTTPServiceUnavailable(
                title="trigger refused", description="its secret cannot be read"))
        except BadSignature as exc:
            self._refuse(trigger, f"bad signature: {exc}", falcon.HTTPUnauthorized(
                title="bad signature", description=str(exc)))
        if not self.web.layout.queue_dir(found.dest).is_dir():
            why = f"no queue named {found.dest}"
            self._refuse(trigger, why, falcon.HTTPServiceUnavailable(
                title="trigger refused", description=why))
        got = self._create(req, found, delivery)
        duplicate = bool(got.get("duplicate"))
        self._note(trigger, "duplicate" if duplicate else "made",
                   last_msg_id=got["msg_id"], last_queue=found.dest)
        if duplicate:
            resp.set_header(DUPLICATE_HEADER, "true")
        resp.media = ["ok", self.web.msg_url(found.dest, got["msg_id"])]

    def _trigger(self, name: str) -> spec.Trigger:
        """The webhook trigger ``name``: 404 without one, 503 for a refused file."""
        try:
            found = self.triggers.get(name)
        except NotFound:
            raise
        except RQError as exc:
            self._refuse(name, listing.shown(self.web.layout, str(exc)),
                         falcon.HTTPServiceUnavailable(
                             title="trigger refused",
                             description=f"the file of trigger {name} is refused "
                                         "(rq triggers says why)"))
        if found.kind != "webhook":
            raise NotFound(f"trigger {name} is no webhook")
        return found

    def _body(self, req: falcon.Request, found: spec.Trigger) -> bytes:
        """The raw body, at most ``max_body`` bytes (413 for more, read no further)."""
        limit = int(found.settings["max_body"])
        if (req.content_length or 0) > limit:
            self._too_large(found.name, limit)
        body = req.bounded_stream.read(limit + 1)
        if len(body) > limit:
            self._too_large(found.name, limit)
        return bytes(body)

    def _too_large(self, name: str, limit: int) -> NoReturn:
        why = f"the body is larger than max_body ({limit} bytes)"
        self._refuse(name, why, TooLarge(why))

    def _create(self, req: falcon.Request, found: spec.Trigger,
                delivery: webhook.Delivery) -> dict[str, Any]:
        """The create, as ``trigger <name>``, the body attached as an open file."""
        by = f"trigger {found.name}"
        actor = {"user": by, "address": str(req.remote_addr or "")[:100], "role": "operator"}
        fd, md5 = webhook.body_file(delivery.body)
        attached = [{"name": webhook.attachment_name(delivery), "md5": md5}]
        try:
            return self.web.call(found.dest, "create", msg=webhook.message(found, delivery),
                                 by=by, actor=actor, attachments=attached, fds=[fd])
        except RQError as exc:
            self._refuse(found.name, f"{type(exc).__name__}: {exc}", exc)
        finally:
            os.close(fd)

    def _refuse(self, name: str, why: str, error: Exception) -> NoReturn:
        """Count the refusal, say it on stderr, and answer with ``error``."""
        print(f"rqsys web: trigger {name}: refused: {why}", file=sys.stderr, flush=True)
        self._note(name, "refused", error=why)
        raise error

    def _note(self, name: str, outcome: str, **fields: Any) -> None:
        """Count ``outcome`` in the trigger's record (the answer is what matters:
        a record that cannot be written is told on stderr and stays behind)."""
        try:
            record.note(self.where, name, outcome, **fields)
        except OSError as exc:
            print(f"rqsys web: trigger {name}: record not written: {exc}", file=sys.stderr,
                  flush=True)


class TriggersJSON(Resource):
    """``GET /triggers.json``: every trigger, its kind, queue and record."""

    every_queue = True  # a user of some queues does not see them (rqsys.web.access)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        entries = listing.list_triggers(self.web.layout)
        for entry in entries:
            if "path" in entry:
                entry["path"] = self.web.prefix + entry["path"]
        resp.media = entries
