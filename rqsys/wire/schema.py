"""The shape of every socket request: one JSON Schema per operation.

Written here rather than in ``rqsys/schemas/`` so that ids, attachment names
and states are checked with the very patterns and lists the store uses (one
copy of each).  A message's own fields are checked by ``message.json`` when
it is made (``rqsys.message.new_message``).  An op's full validator is
compiled on its first use, once: only a request the fast path below does not
pass needs one, and compiling every op's at start took some 20 ms and 1.5
MiB of an idle daemon (``tests/unit/wire/test_wire_schema.py`` compiles them all).
An error names the field: ``invalid message id: '..'``.

A request of a flat schema (what :func:`request` makes) is first asked of
``rqsys.flatcheck`` (a field the schema only names, such as ``create``'s
``msg``, is not checked there at all): a plain create's check then costs a
few microseconds instead of some thirty.  Only its "valid" is trusted;
anything else goes to the full validator, whose error is the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rqsys import tunables
from rqsys.errors import BadRequest
from rqsys.flatcheck import flat_check
from rqsys.message import TAG_PATTERN
from rqsys.store import ADMIN_OPERS, ATTACH_NAME_RE, MSG_ID_RE, STATES
from rqsys.wire.roles import ROLES

if TYPE_CHECKING:
    import jsonschema

MSG_ID = {"title": "message id", "type": "string", "pattern": MSG_ID_RE.pattern}
ATTACH_NAME = {"title": "attachment name", "type": "string", "pattern": ATTACH_NAME_RE.pattern,
               "not": {"pattern": r"\.\."}}
MD5 = {"title": "md5 (32 lowercase hex digits)", "type": "string", "pattern": "^[0-9a-f]{32}$"}
COUNT = {"type": "integer", "minimum": 0}
DAYS = {"type": "number", "minimum": 0}
FLAG = {"type": "boolean"}
BY = {"title": "creator (by)", "type": "string", "maxLength": 200}
# Who asked, as an admin peer (the web, a daemon) says for the one it acts
# for, with that one's role and queues; the daemon believes it from an admin
# peer only (``rqsys.daemon.audit``, ``rqsys.wire.roles.require``).
ACTOR = {"title": "actor", "type": "object",
         "properties": {"user": {"type": "string", "maxLength": 200},
                        "address": {"type": "string", "maxLength": 100},
                        "role": {"title": "actor's role", "enum": list(ROLES)},
                        "queues": {"title": "actor's queues", "type": "array", "maxItems": 100,
                                   "items": {"type": "string", "maxLength": 200}}},
         "additionalProperties": False}
# ``link``: the file is handed over, hard-link it (where the file system allows)
# instead of copying it; taken from an admin peer only (``rqsys.daemon.intake``)
ATTACHMENT = {"type": "object", "properties": {"name": ATTACH_NAME, "md5": MD5, "link": FLAG},
              "required": ["name", "md5"], "additionalProperties": False}


def request(required: tuple[str, ...] = (), **fields: Any) -> dict[str, Any]:
    """The schema of one request: ``op``, ``actor`` (see ACTOR) and ``fields``, nothing else."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "properties": {"op": {"type": "string"}, "actor": ACTOR, **fields},
            "required": ["op", *required], "additionalProperties": False}


WITH_ID = request(("msg_id",), msg_id=MSG_ID)

OPS: dict[str, dict[str, Any]] = {
    "ping": request(), "counts": request(), "config": request(), "reload": request(),
    **dict.fromkeys(("get", "state", "status", "commit", "delete", "destroy", "clone",
                     "run_now"), WITH_ID),
    "create": request(
        msg={"title": "message"},  # its fields: message.json, when it is made
        state={"title": "state for a new message", "enum": ["que", "prep"]},
        single=FLAG, refuse_paused=FLAG, by=BY,
        attachments={"title": "attachments", "type": "array", "items": ATTACHMENT}),
    "create_many": request(
        ("msgs",), msgs={"title": "messages", "type": "array", "minItems": 1,
                         "maxItems": tunables.BULK_MAX},
        state={"title": "state for a new message", "enum": ["que", "prep"]},
        refuse_paused=FLAG, by=BY),
    "attach": request(("msg_id", "name", "md5"), msg_id=MSG_ID, name=ATTACH_NAME, md5=MD5),
    "list": request(state={"title": "state", "enum": list(STATES)}, offset=COUNT, limit=COUNT,
                    tag={"title": "tag", "type": "string", "pattern": TAG_PATTERN}),
    "adminoper": request(("oper",), oper={"title": "admin operation",
                                          "enum": list(ADMIN_OPERS)}),
    "cancel": request(("msg_id",), msg_id=MSG_ID, by=BY),
    "prune": request(days=DAYS, prep_days={"anyOf": [DAYS, {"type": "null"}]}),
}


def _compile(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    import jsonschema  # here: a daemon whose requests all pass the fast path never needs it

    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


_FLAT = {op: flat_check(schema) for op, schema in OPS.items()}


class Checker:
    """Checks requests against their op's schema (full validators compiled on first use)."""

    def __init__(self, schemas: Mapping[str, dict[str, Any]]) -> None:
        self._schemas = dict(schemas)
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        self._flat = {op: _FLAT[op] if s is OPS.get(op) else flat_check(s)
                      for op, s in schemas.items()}

    def check(self, op: str, args: dict[str, Any]) -> None:
        """BadRequest naming the field, unless ``args`` is a valid ``op`` request."""
        flat = self._flat[op]
        if flat is not None and flat.passes(args):
            return
        import jsonschema

        error = jsonschema.exceptions.best_match(self.validator(op).iter_errors(args))
        if error is not None:
            raise BadRequest(_describe(op, error))

    def validator(self, op: str) -> jsonschema.protocols.Validator:
        """``op``'s full validator, compiled (and its schema checked) the first time."""
        found = self._validators.get(op)
        if found is None:
            found = self._validators[op] = _compile(self._schemas[op])
        return found


def _describe(op: str, error: jsonschema.ValidationError) -> str:
    field_schema = error.schema if isinstance(error.schema, dict) else {}
    title = field_schema.get("title")
    if title and error.validator == "enum":
        choices = ", ".join(str(c) for c in field_schema["enum"])
        return f"unknown {title} {str(error.instance)[:40]!r} ({choices})"
    if title:
        return f"invalid {title}: {_short(repr(error.instance))}"
    field = "/".join(str(p) for p in error.absolute_path) or "(top level)"
    return f"bad request: {op}: {field}: {_short(error.message)}"


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
