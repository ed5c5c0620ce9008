"""One copy in memory of the strings every queued message repeats: field
names, its queue's name, its own id.

A daemon holds each queued message as the dict its ``msg`` file decodes
to.  ``json.loads`` makes new key strings at every call (its memo lives one
call), so 100,000 messages read one by one at start held 100,000 copies of
``"dest"``, ``"param1"``, ... (some 330 bytes a message), one more of the
queue's name and a second of the id the directory already named: about
40 MiB of a 130 MiB daemon.  :func:`shared` swaps them for one shared
string each; the message is equal to what it was.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rqsys.store.layout import CREATED_BY

_DECODER = json.JSONDecoder()
_intern = sys.intern


def parse(whole: bytes) -> Any:
    """``json.loads(whole)``, without its encoding sniffing on the common
    path (UTF-8 without a BOM): the same value, or the same ValueError."""
    try:
        return _DECODER.decode(whole.decode())
    except ValueError:
        return json.loads(whole)  # UTF-16, a BOM, or an error: json's own answer


def shared(msg_id: str, msg: dict[str, Any]) -> dict[str, Any]:
    """``msg`` with its field names, ``dest`` and ``msg_id`` one shared string each."""
    return shared_values(msg_id, {_intern(key): value for key, value in msg.items()})


def shared_values(msg_id: str, msg: dict[str, Any]) -> dict[str, Any]:
    """``msg`` itself, its ``dest``, ``created_by`` and ``msg_id`` made one
    shared string each (for messages whose field names are shared already: a
    snapshot's)."""
    for field in ("dest", CREATED_BY):  # a queue's name, a client: many messages share it
        value = msg.get(field)
        if type(value) is str and len(value) <= 256:
            msg[field] = _intern(value)
    if msg.get("msg_id") == msg_id:
        msg["msg_id"] = msg_id  # the directory's name, which the daemon keeps anyway
    return msg
