"""The OpenAPI schemas of what observing a queue answers: its stats (with the
room its running messages hold), timers and failure groups, for ``rqsys.web.openapi``."""

from __future__ import annotations

from rqsys.store import STATES

ROOM = {"type": "object", "additionalProperties": {"type": "object"}, "description": "slots, "
        "and the budget's memory (bytes), cpus, gpus (ids): used of total, each"}
WINDOW_TIMES = {"type": "object", "properties": {
    q: {"type": ["number", "null"]} for q in ("p50", "p95", "p99")}}
STATS = {"type": "object", "required": ["totals", "hist", "windows", "days", "counts"],
         "properties": {
             "totals": {"type": "object", "additionalProperties": {"type": "integer"}},
             "hist": {"type": "object", "additionalProperties": {
                 "type": "array", "items": {"type": "integer"}}},
             "bounds": {"type": "array", "items": {"type": "number"}},
             "windows": {"type": "object", "additionalProperties": {
                 "type": "object", "properties": {
                     "throughput_per_s": {"type": "number"},
                     "wait": WINDOW_TIMES, "run": WINDOW_TIMES}}},
             "days": {"type": "object", "additionalProperties": {"type": "object"}},
             "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
             "starts": {"type": "integer"},
             "oldest_queued_s": {"type": ["number", "null"]}, "room": ROOM,
             "loop": {"type": "object", "description": "the event loop's seconds since the "
                      "daemon started: waiting for events, blocked starting scripts, its "
                      "thread's CPU", "properties": {
                          "idle_s": {"type": "number"}, "spawn_s": {"type": "number"},
                          "cpu_s": {"type": "number"}}},
             "timelines": {"type": "object", "description": "timeline lines not written "
                           "since the daemon started, and the last one's reason",
                           "properties": {"failed": {"type": "integer"},
                                          "error": {"type": "string"}}},
             "index": {"type": "object", "description": "search index batches that failed "
                       "since the daemon started, the last one's reason, and whether the "
                       "index misses events (searches are partial until it is mended)",
                       "properties": {"failed": {"type": "integer"},
                                      "error": {"type": "string"},
                                      "behind": {"type": "boolean"}}}}}
WHEN = {"type": ["number", "null"], "description": "epoch seconds"}
TIMER = {"type": "object", "required": ["name", "file"], "properties": {
    "name": {"type": "string"}, "file": {"type": "string"},
    "error": {"type": "string", "description": "why the file is refused"},
    "schedule": {"type": "string"}, "dest": {"type": "string"}, "next": WHEN, "last": WHEN,
    "last_slot": WHEN, "last_msg_id": {"type": "string"}, "last_queue": {"type": "string"},
    "last_url": {"type": "string"},
    "last_state": {"enum": [*STATES, "gone"]},
    "overlap": {"enum": ["queue", "skip"]},
    "skipped": {"type": "integer", "minimum": 0, "description": "slots overlap skip skipped, ever"},
    "last_skipped": WHEN,
    "skips": {"type": "array", "description": "the latest skipped slots (at most 20), oldest first",
              "items": {"type": "object", "properties": {
                  "slot": {"type": "number"}, "at": {"type": "number"},
                  "msg_id": {"type": "string"}, "state": {"enum": ["prep", "que", "run"]}}}}}}
GROUP_JSON = {"type": "object", "required": ["key", "reason", "count"], "properties": {
    "key": {"type": "string"}, "reason": {"type": "string"}, "count": {"type": "integer"},
    "first_seen": {"type": "number"}, "last_seen": {"type": "number"},
    "example": {"type": "string"},
    "last_line": {"type": "string", "description": "for a status that says only how the run "
                  "exited (RQ's PROCESS EXITED IMPROPERLY): the last line it wrote, which the "
                  "reason begins with; else empty"}}}
GROUP_KEY = {"name": "key", "in": "path", "required": True,
             "schema": {"type": "string", "pattern": "^[0-9a-f]{12}$"}}
