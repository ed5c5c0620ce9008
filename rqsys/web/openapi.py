"""The OpenAPI 3 document of the HTTP API (built here, served at ``/openapi.json``)."""

from __future__ import annotations

from typing import Any

from rqsys.store import ADMIN_OPERS
from rqsys.web import openapi_audit, openapi_batches, openapi_hooks, openapi_search
from rqsys.web.openapi_observe import GROUP_JSON, GROUP_KEY, STATS, TIMER

QUEUE = {"name": "name", "in": "path", "required": True,
         "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"}}
MSG_ID = {"name": "mid", "in": "path", "required": True,
          "schema": {"type": "string", "pattern": r"^\d{8}\.\d{4}\.\d{2}\.\d{3}(\.\d{1,9})?$"}}
NAME = {"type": "string", "pattern": "^[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,199}$"}
FAIL = {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2,
        "description": '["fail", why]'}
OK_STRING = {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2,
             "description": '["ok", value]'}
NUMBER_TEXT = {"type": "string", "pattern": "^ *[+-]?[0-9]"}
MESSAGE = {"type": "object", "additionalProperties": False,
           "description": "The mesg JSON. RQ's clients put _method inside it and may send "
                          "numbers as strings (converted as RQ's to_i / to_f do).",
           "properties": {
               "dest": {"type": "string"}, "src": {"type": "string"},
               **{f"param{i}": {"type": "string"} for i in range(1, 5)},
               "due": {"oneOf": [{"type": "number", "minimum": 0}, NUMBER_TEXT]},
               "count": {"oneOf": [{"type": "integer", "minimum": 0}, NUMBER_TEXT]},
               "max_count": {"oneOf": [{"type": "integer", "minimum": 1}, NUMBER_TEXT]},
               "orig_msg_id": {"type": "string"},
               "force_remote": {"oneOf": [{"type": "boolean"}, {"type": "string"}]},
               "post_run_webhook": {"oneOf": [{"type": "array", "items": {"type": "string"}},
                                              {"type": "string"}]},
               "relay_via": {"type": "array", "items": {"type": "string"}},
               "unique_key": {"type": "string", "minLength": 1, "description":
                              "while a message with this key is in prep, que or run (or "
                              "ended under unique_for s ago) the answer is its URL, with the "
                              "header RQ-Duplicate: true; \"params\": the key is param1..4"},
               "unique_for": {"oneOf": [{"type": "number", "minimum": 0}, NUMBER_TEXT]},
               "timer": {"type": "string"},
               "slot": {"oneOf": [{"type": "number", "minimum": 0}, NUMBER_TEXT]},
               "timeout": {"type": "number", "exclusiveMinimum": 0,
                           "description": "seconds its script may run (<= the queue's)"},
               "retry_max": {"type": "integer", "minimum": 0, "maximum": 1000},
               "priority": {"type": "integer", "minimum": -1000, "maximum": 1000,
                            "description": "among due messages, smaller runs first"},
               "limits": {"type": "object", "description":
                          "run limits (memory_max \"1G\", cpu_quota \"50%\", tasks_max, "
                          "runtime_max s); only those tighter than the queue's "
                          "message_limits count"},
               "tags": {"type": "array", "maxItems": 16, "items": {"type": "string"},
                        "description": "short words to find it by (listings' ?tag=)"},
               "after": {"type": "array", "maxItems": 64, "items": {"type": "string"},
                         "description": "URLs (or ids of this queue) of messages that must "
                         "be done first; it waits in que, status \"waiting for N\""},
               "after_policy": {"enum": ["fail", "wait"],
                                "description": "one of them ended in err: fail (default) "
                                "or wait for its retry"},
               "_method": {"enum": ["commit", "prep", "single_que"]}}}
# new_messages' items: created as they are (no _method), and no unique_key (a
# bulk create takes none: each would need its own answer of an existing URL)
BULK_MESSAGE = dict(MESSAGE, description="One message of a bulk create: the mesg JSON "
                    "without _method, unique_key or unique_for",
                    properties={k: v for k, v in MESSAGE["properties"].items()  # type: ignore[attr-defined]
                                if k not in ("_method", "unique_key", "unique_for")})
STATES = ["prep", "que", "run", "done", "err", "relayed"]
TIMES = {"created_at": "Unix time it was created", "started_at": "its last run started",
         "ended_at": "it ended (done, err or relayed)",
         "wait_s": "seconds from created (or due, if later) to its first start",
         "run_s": "seconds its last run took"}
TAG = {"name": "tag", "in": "query", "required": False,
       "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:=+-]{0,63}$"},
       "description": "only messages carrying this tag"}
MESSAGE_JSON = {"type": "object", "required": ["msg_id", "state", "status", "_attachments"],
                "properties": {
                    "msg_id": {"type": "string"}, "url": {"type": "string"},
                    "state": {"enum": STATES},
                    "status": {"type": "string", "description": "RQ's '<state> - <text>'"},
                    "status_text": {"type": "string", "description": "the script's last words"},
                    **{key: {"type": ["number", "null"], "description": why}
                       for key, why in TIMES.items()},
                    "_timeline": {"type": "array", "items": {
                        "type": "object", "required": ["t", "ev"],
                        "properties": {"t": {"type": "number"}, "ev": {"type": "string"}}},
                        "description": "the message's timeline, at most 200 events: "
                                       "consecutive status lines folded into their last "
                                       "(folded: how many, earlier: the 20 before it), then "
                                       "the oldest events left out but never a created, "
                                       "started, exit or end (a started event has pid, or "
                                       "handed: relay worker; a retry or an err its run's "
                                       "last_lines)"},
                    "progress": {"type": ["object", "null"], "description": "a running "
                                 "message whose status begins N% or N/M: fraction (0-1), "
                                 "and done and total for N/M; else null"},
                    "last_lines": {"type": "array", "items": {"type": "string"},
                                   "description": "in err: the last 20 lines (not blank) "
                                   "its failed run wrote, as a terminal shows them"},
                    "cancelled": {"type": "boolean", "description": "in err by a cancel"},
                    "trace_id": {"type": "string", "pattern": "^[0-9a-f]{32}$",
                                 "description": "its trace's id (traceparent's second "
                                 "part), when it has one (rqsys(8) TRACES)"},
                    "_attachments": {"type": "object", "additionalProperties": {
                        "type": "object", "required": ["md5", "size"],
                        "properties": {"md5": {"type": "string"},
                                       "size": {"type": "integer"}}}}}}
SUMMARY = {"type": "object", "required": ["status"],
           "description": "RQ's shape (a DOWN queue: status only), rqsys's fields beside",
           "properties": {"status": {"enum": ["UP", "PAUSE", "DOWN", "SCRIPTERROR"]},
                          "uptime": {"type": "integer", "minimum": 0},
                          **{f"{s}_size": {"type": "integer"} for s in STATES},
                          "name": {"type": "string"}, "url": {"type": "string"},
                          "admin_state": {"enum": ["UP", "PAUSE", "DOWN"]},
                          "status_line": {"type": "string"}, "error": {"type": "string"},
                          "num_workers": {"type": "integer"},
                          "counts": {"type": "object",
                                     "additionalProperties": {"type": "integer"}}}}
OFFSET = {"name": "offset", "in": "query", "required": False,
          "schema": {"type": "integer", "minimum": 0}}
FORM_POST: dict[str, Any] = {"type": "object", "properties": {
    "back": {"type": "string", "pattern": "^/[a-z]"}, "x_format": {"enum": ["json", "html"]}}}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _answers(ok_schema: dict[str, Any], ctype: str = "application/json",
             ok_status: str = "200") -> dict[str, Any]:
    """The OK answer, 303 after a form post, and RQ's ``["fail", why]`` errors (a
    page of the console instead for a browser, and the form again, with the
    error by its field, for the new-message form's ``x_format=html``)."""
    fail = {"description": "failure: [\"fail\", why] (text/html: for a browser)",
            "content": {**_json(FAIL), "text/html": {"schema": {"type": "string"}}}}
    return {ok_status: {"description": "success", "content": {ctype: {"schema": ok_schema}}},
            "303": {"description": "redirect to back"},
            "400": fail, "401": fail, "404": fail, "405": fail, "416": fail, "503": fail,
            "507": fail,  # the state file system is full (NoSpace): nothing was taken
            "403": {"description": "forbidden: the user's role does not cover the request "
                                   "(the answer names the role needed), a browser's "
                                   "cross-site change (Sec-Fetch-Site not same-origin, or "
                                   "an Origin that is not this host), or new queues are off",
                    "content": _json(FAIL)},
            "413": {"description": "too large: the body, or a message field (the answer "
                                   "names the field and its limit)", "content": _json(FAIL)},
            "421": {"description": "a browser's request naming a host that is not this "
                                   "server's (DNS rebinding: allowed_hosts)",
                    "content": _json(FAIL)}}


def _get(params: list[dict[str, Any]], schema: dict[str, Any], summary: str,
         ctype: str = "application/json") -> dict[str, Any]:
    return {"get": {"summary": summary, "parameters": params, "responses": _answers(schema, ctype)}}


def _post(params: list[dict[str, Any]], body: dict[str, Any], summary: str,
          schema: dict[str, Any] = OK_STRING, ctype: str = "application/x-www-form-urlencoded"
          ) -> dict[str, Any]:
    return {"post": {"summary": summary, "parameters": params,
                     "requestBody": {"required": True, "content": {ctype: {"schema": body}}},
                     "responses": _answers(schema)}}


TRACEPARENT = {"name": "traceparent", "in": "header", "required": False,
               "description": "W3C trace context: with traces on (rqsys(8) TRACES) the "
               "message's create span continues it; a malformed one is ignored",
               "schema": {"type": "string"}}


def _duplicate_header(path: dict[str, Any]) -> dict[str, Any]:
    """new_message's ok answer may be an existing message's URL: its header says so."""
    path["post"]["responses"]["200"]["headers"] = {"RQ-Duplicate": {
        "description": "true when the message's unique_key was held: the URL is the "
                       "holder's and no message was made", "schema": {"enum": ["true"]}}}
    return path


def _with(extra: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {**FORM_POST["properties"], **extra}}


HTML = {"type": "string"}
TEXT = {"type": "string"}


def _mesg_form() -> dict[str, Any]:
    return _with({"mesg": {"type": "string", "contentMediaType": "application/json",
                           "contentSchema": MESSAGE,
                           "description": "the message as JSON text; RQ's _method "
                                          "(commit | prep | single_que) goes inside it"},
                  **{f"mesg_{f}": {"type": "string"} for f in (
                      "src", "param1", "param2", "param3", "param4")},
                  "mesg_max_count": {"type": "string", "pattern": "^[0-9]{1,5}$"},
                  **{f"mesg_{f}": {"type": "string"} for f in (
                      "priority", "timeout", "retry_max")},
                  "mesg_tags": {"type": "string", "description": "tags, by commas or spaces"},
                  "mesg_unique_key": {"type": "string"},
                  "mesg_unique_for": {"type": "string", "description": "seconds"},
                  "mesg_after": {"type": "string", "description": "URLs, by commas or spaces"},
                  "mesg_after_policy": {"enum": ["fail", "wait"]},
                  "_method": {"enum": ["commit", "prep", "single_que"],
                              "description": "outside mesg: what older rqsys sent"}})


def _new_queue_form() -> dict[str, Any]:
    return _with({"queue[name]": {"type": "string"}, "queue[script]": {"type": "string"},
                  "queue[num_workers]": {"type": "string"},
                  "queue[exec_prefix]": {"type": "string"},
                  **{f"queue[{k}][{f}]": {"type": "string"}
                     for k, f in (("rate_limit", "limit"), ("rate_limit", "per"),
                                  ("concurrency", "limit"))},
                  "queue[rate_limit][by][]": {"type": "string"},
                  "queue[concurrency][by][]": {"type": "string"},
                  "name": {"type": "string"}, "script": {"type": "string"},
                  "num_workers": {"type": "integer"}})


def _paths() -> dict[str, Any]:
    return _add_links({**_queue_paths(), **_message_paths(), **_observe_paths()})


def _observe_paths() -> dict[str, Any]:
    return {
        "/metrics": _get([], TEXT, "Prometheus metrics of every queue (text format 0.0.4)",
                         "text/plain"),
        "/q/{name}/stats.json": _get([QUEUE], STATS, "A queue's statistics: totals, "
                                     "histograms, last hour/day/week, per day"),
        "/q/{name}/groups.json": _get([QUEUE], {"type": "array", "items": GROUP_JSON},
                                      "Failure groups: err messages by normalised reason"),
        "/q/{name}/groups/{key}": {
            **_get([QUEUE, GROUP_KEY, OFFSET], HTML, "A failure group's page: its reason, "
                   "example and messages (HTML, 25 a page)", "text/html"),
            **_post([QUEUE, GROUP_KEY], _with({"_method": {"enum": ["retry", "delete"]}}),
                    "Retry (err → que) or delete a whole failure group", {"type": "array"})},
        **openapi_search.paths(QUEUE, _get, _post, _with, HTML),
        **openapi_batches.paths(_get, _post, HTML),
        **openapi_audit.paths(_get, HTML),
        **openapi_hooks.paths(_get, _answers, OK_STRING),
    }


def _link(path: str, method: str, **params: str) -> dict[str, Any]:
    ref = "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method
    return {"operationRef": ref, "parameters": params}


def _add_links(paths: dict[str, Any]) -> dict[str, Any]:
    """Links for stateful clients: a queue name from /q.json, a message id from done.json."""
    name = {"name": "$response.body#/0"}
    paths["/q.json"]["get"]["responses"]["200"]["links"] = {
        "summary": _link("/q/{name}.json", "get", **name),
        "config": _link("/q/{name}/config.json", "get", **name),
        "done": _link("/q/{name}/done.json", "get", **name),
        "stats": _link("/q/{name}/stats.json", "get", **name),
        "new_message": _link("/q/{name}/new_message", "post", **name)}
    mid = {"name": "$request.path.name", "mid": "$response.body#/0"}
    paths["/q/{name}/done.json"]["get"]["responses"]["200"]["links"] = {
        "message": _link("/q/{name}/{mid}.json", "get", **mid),
        "state": _link("/q/{name}/{mid}/state.json", "get", **mid),
        "tail": _link("/q/{name}/{mid}/tail.json", "get", **mid),
        "log": _link("/q/{name}/{mid}/log/{file}", "get", **mid, file="stdio.log"),
        "clone": _link("/q/{name}/{mid}/clone", "post", **mid),
        "change": _link("/q/{name}/{mid}", "post", **mid)}
    return paths


def _queue_paths() -> dict[str, Any]:
    return {
        "/": _get([], HTML, "Dashboard (HTML)", "text/html"),
        "/q.json": _get([], {"type": "array", "items": {"type": "string"}}, "Queue names"),
        "/q.txt": _get([], TEXT, "RQ's queue list: one q/<name>.txt line each", "text/plain"),
        "/q/{name}.json": _get([QUEUE], SUMMARY, "RQ's queue summary: status, uptime, sizes"),
        "/q/{name}.txt": _get([QUEUE], TEXT, "RQ's summary lines (status: UP, uptime: N, "
                                             "prep: N, ...)", "text/plain"),
        "/q/{name}/config.json": _get([QUEUE], {"type": "object"}, "Effective queue config"),
        "/q/{name}/done.json": {"get": {
            "summary": "Newest done message ids", "parameters": [QUEUE, {
                "name": "limit", "in": "query", "required": False,
                "schema": {"type": "integer", "minimum": 0, "maximum": 1000}}, TAG],
            "responses": _answers({"type": "array", "items": {"type": "string"}})}},
        "/q/{name}/new_messages": {"post": {
            "summary": "Create many messages: a JSON array, or NDJSON streamed; each "
                       "fails alone (with its index), the others are created",
            "parameters": [QUEUE],
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": {"type": "array", "items": BULK_MESSAGE}},
                "application/x-ndjson": {"schema": {"type": "string"}}}},
            "responses": _answers({"type": "object", "properties": {
                "created": {"type": "integer"}, "failed": {"type": "integer"},
                "results": {"type": "array", "items": {"type": "object"}},
                "stopped": {"type": "object", "description": "the daemon failed after "
                            "earlier batches were created: the messages from index on were "
                            "not sent", "properties": {
                                "index": {"type": "integer"}, "error": {"type": "string"},
                                "kind": {"type": "string"}}}}})}},
        "/q/{name}/messages.json": {"get": {
            "summary": "One state's message ids, a page at a time, optionally by tag",
            "parameters": [QUEUE, {"name": "state", "in": "query", "required": False,
                                   "schema": {"enum": STATES}}, TAG,
                           *({"name": n, "in": "query", "required": False,
                              "schema": {"type": "integer", "minimum": 0}}
                             for n in ("offset", "limit"))],
            "responses": _answers({"type": "object", "properties": {
                "ids": {"type": "array", "items": {"type": "string"}},
                "total": {"type": "integer"}}})}},
        "/q/{name}/new_message": _duplicate_header(_post(
            [QUEUE, TRACEPARENT], _mesg_form(), "Create a message (mesg=<JSON>, _method inside)")),
        "/q/{name}/adminoper": _post([QUEUE], _with({"oper": {
            "enum": list(ADMIN_OPERS)}}), "Set the admin state"),
        "/timers.json": _get([], {"type": "array", "items": TIMER},
                             "Timers: schedule, next and last run, last message and its state"),
        "/timers": _get([], HTML, "Timers (HTML)", "text/html"),
        "/q/{name}/trends": _get([QUEUE, {"name": "range", "in": "query", "required": False,
                                          "schema": {"enum": ["1h", "24h", "7d"]}}],
                                 HTML, "A queue's trends (HTML): ended per interval, wait "
                                 "and run p50/p95/p99, charted", "text/html"),
        "/new_queue": _post([], _new_queue_form(), "Create a queue (allow_new_queue): RQ's "
                                           "queue[...] form fields or plain ones"),
    }


def _message_paths() -> dict[str, Any]:
    qm = [QUEUE, MSG_ID]
    return {
        "/q/{name}/{mid}.json": _get(qm, MESSAGE_JSON, "A message with state and status"),
        "/q/{name}/{mid}": _post(qm, _with({"_method": {"enum": [
            "delete", "destroy", "commit", "retry", "cancel"]}}), "Delete, destroy, commit, "
            "retry (err → que) or cancel (que or run → err, its script stopped) a message"),
        "/q/{name}/{mid}/state.json": _get(qm, {"type": "array", "items": {"type": "string"},
                                                 "minItems": 1, "maxItems": 1},
                                           "A message's state"),
        "/q/{name}/{mid}/tail.json": {"get": {
            "summary": "Output of job/stdio.log from offset (at most 1 MiB), or from the "
                       "first line of its last N bytes", "parameters": [*qm, {
                "name": "offset", "in": "query", "required": False,
                "schema": {"type": "integer", "minimum": 0, "maximum": 2**62}}, {
                "name": "last", "in": "query", "required": False,
                "schema": {"type": "integer", "minimum": 1, "maximum": 2**62}}],
            "responses": _answers({"type": "object", "required": [
                "data", "from", "offset", "size", "state", "status", "progress",
                "ended"]})}},
        "/q/{name}/{mid}/log/{file}": _get([*qm, {"name": "file", "in": "path",
                                                   "required": True, "schema": NAME}],
                                           TEXT, "A job log file (Range honoured)",
                                           "text/plain"),
        "/q/{name}/{mid}/attach/{aname}": _get([*qm, {"name": "aname", "in": "path",
                                                       "required": True, "schema": NAME}],
                                               {"type": "string", "format": "binary"},
                                               "An attachment", "application/octet-stream"),
        "/q/{name}/{mid}/attach/new": _post(qm, {
            "type": "object", "required": ["filedata"],
            "properties": {"x_format": {"enum": ["json", "html"]},
                           "filedata": {"type": "string", "format": "binary"}}},
            "Attach a file to a prep message (answers '<md5>-Attached successfully')",
            ctype="multipart/form-data"),
        "/q/{name}/{mid}/clone": _post(qm, FORM_POST, "Clone a message"),
        "/q/{name}/{mid}/run_now": _post(qm, FORM_POST, "Make a queued message due now"),
    }


def document(prefix: str) -> dict[str, Any]:
    return {"openapi": "3.1.0",
            "info": {"title": "rqsys HTTP API", "version": "1",
                     "description": "RQ's routes: answers are [\"ok\", value] or "
                                    "[\"fail\", why]."},
            "servers": [{"url": prefix or "/"}],
            "paths": _paths()}
