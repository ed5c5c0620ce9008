"""A webhook delivery made into a message: its signature, params, unique key and body file.

What the web's ``POST /hooks/<name>`` does between reading the body and
asking the queue daemon to create (``rqsys.web.hooks``), kept free of HTTP:
the secret read now (:mod:`rqsys.triggers.secrets`), the signature checked
(:mod:`rqsys.triggers.signatures`), then the message: the trigger's ``msg``
with the event's params (:mod:`rqsys.triggers.params`) and, when the
delivery has an id, ``unique_key`` ``hook:<name>:<id>`` (the daemon answers
a delivery seen again with the message it made, ``"duplicate": true``).
The body goes with the create as an open file (a memfd), attached as
``body.json`` when it is JSON, else ``body``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

from rqsys.triggers import params, secrets, signatures
from rqsys.triggers.spec import Trigger

MAX_DELIVERY_ID = 200  # characters of a delivery id kept in the unique key


@dataclass(frozen=True)
class Delivery:
    """One request to a hook: its raw body, content type and headers."""

    body: bytes
    content_type: str
    header: signatures.Headers


def check(trigger: Trigger, delivery: Delivery, now: float | None = None) -> None:
    """Pass, or SecretUnreadable / BadSignature."""
    hook = trigger.settings
    secret = secrets.read_secret(hook["secret"])
    signatures.verify(hook["signature"], secret, delivery.body, delivery.header,
                      name=str(hook["header"]), tolerance=int(hook["tolerance"]), now=now)


def delivery_id(trigger: Trigger, delivery: Delivery) -> str:
    """The delivery's id ("" when the trigger names none or the event has none)."""
    hook = trigger.settings
    found: Any = None
    if hook.get("delivery_header"):
        found = delivery.header(str(hook["delivery_header"]))
    if not found and hook.get("delivery_path"):
        doc = params.parse_body(delivery.body)
        value = params.MISSING if doc is params.MISSING else params.lookup(
            doc, str(hook["delivery_path"]))
        found = None if value is params.MISSING else params.text(value)
    return str(found or "").strip()[:MAX_DELIVERY_ID]


def message(trigger: Trigger, delivery: Delivery) -> dict[str, Any]:
    """The message to create: ``msg``, the event's params, and the unique key."""
    msg = {**trigger.msg, **params.gather(trigger.params, delivery.body, delivery.header)}
    ident = delivery_id(trigger, delivery)
    if ident:
        msg["unique_key"] = f"hook:{trigger.name}:{ident}"
        msg["unique_for"] = trigger.settings["unique_for"]
    return msg


def is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/")
                                          and kind.endswith("+json"))


def attachment_name(delivery: Delivery) -> str:
    return "body.json" if is_json(delivery.content_type) else "body"


def body_file(body: bytes) -> tuple[int, str]:
    """An open memfd holding ``body``, and its MD5 (the caller closes the fd)."""
    fd = os.memfd_create("rqsys-hook-body", os.MFD_CLOEXEC)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd, hashlib.md5(body, usedforsecurity=False).hexdigest()
