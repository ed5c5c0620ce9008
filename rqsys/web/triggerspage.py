"""``GET /triggers`` (HTML): every trigger, its kind and queue, its counts, last
fire and last error (:mod:`rqsys.triggers.listing`, as ``/triggers.json``)."""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.timers.listing import when
from rqsys.triggers import listing
from rqsys.web.context import Resource
from rqsys.web.html import render


class TriggersPage(Resource):
    every_queue = True  # a user of some queues does not see them (rqsys.web.access)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        entries = listing.list_triggers(self.web.layout)
        render(self.web, resp, "triggers.html", "Triggers",
               [(self.web.path("triggers"), "triggers")],
               triggers=[self._row(t) for t in entries])

    def _row(self, t: dict[str, Any]) -> dict[str, Any]:
        last = t.get("last_msg_id")
        return {"name": t["name"], "kind": t.get("kind", "-"), "dest": t.get("dest", "-"),
                "made": t["made"], "duplicate": t["duplicate"], "refused": t["refused"],
                "last": when(t.get("last_fire")), "msg_id": last or "",
                "href": self.web.msg_path(t["last_queue"], last) if last else "",
                "error": t.get("error", ""), "last_error": t.get("last_error") or ""}
