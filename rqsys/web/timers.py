"""``GET /timers`` (HTML) and ``/timers.json``: every timer, its schedule, next and
last run, and its last message (:mod:`rqsys.timers.listing`)."""

from __future__ import annotations

from typing import Any

import falcon

from rqsys.timers.listing import list_timers, when
from rqsys.web.context import Resource
from rqsys.web.html import e, link, render, table


class Timers(Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        entries = list_timers(self.web.layout)
        if req.path.endswith(".json"):
            resp.media = entries
            return
        rows = [self._row(t) for t in entries]
        body = "<h1>Timers</h1>" + (
            table(["Timer", "Schedule", "Destination", "Next run", "Last run", "Last message",
                   "State"], rows) if rows else '<p class="muted">No timers.</p>')
        render(self.web, resp, "Timers", [(self.web.path("timers"), "timers")], body)

    def _row(self, t: dict[str, Any]) -> list[str]:
        if "error" in t:
            return [e(t["name"]), f'<span class="error">{e(t["error"])}</span>', "", "", "", "",
                    ""]
        last_link = link(self.web.msg_path(t["last_queue"], t["last_msg_id"]),
                         t["last_msg_id"]) if t.get("last_msg_id") else "-"
        return [e(t["name"]), e(t["schedule"]), e(t["dest"]), e(when(t["next"])),
                e(when(t["last"])), last_link, e(t.get("last_state", "-"))]
