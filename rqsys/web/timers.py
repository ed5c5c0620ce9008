"""``GET /timers`` (HTML) and ``/timers.json``: every timer, its schedule, next and
last run, its last message and the slots it skipped (:mod:`rqsys.timers.listing`)."""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.timers.listing import list_timers, skipped_text, when
from rqsys.web.context import Resource
from rqsys.web.html import render


class Timers(Resource):
    every_queue = True  # a user of some queues does not see them (rqsys.web.access)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        entries = list_timers(self.web.layout)
        if req.path.endswith(".json"):
            resp.media = entries
            return
        render(self.web, resp, "timers.html", "Timers", [(self.web.path("timers"), "timers")],
               timers=[self._row(t) for t in entries])

    def _row(self, t: dict[str, Any]) -> dict[str, Any]:
        if "error" in t:
            return {"name": t["name"], "error": t["error"]}
        last = t.get("last_msg_id")
        return {"name": t["name"], "error": "", "schedule": t["schedule"], "dest": t["dest"],
                "next": when(t["next"]), "last": when(t["last"]), "msg_id": last or "",
                "href": self.web.msg_path(t["last_queue"], last) if last else "",
                "state": t.get("last_state", "-"), "skipped": skipped_text(t),
                "skips": ", ".join(when(s["slot"]) for s in t["skips"][-5:])}
