"""Reading a message's job logs straight from the store, with Range and a tail API.

A message may move (run -> done) between finding it and opening its file, so
lookups are retried a few times before giving up.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import falcon

from rqsys.errors import BadRequest, NotFound
from rqsys.run import protocol
from rqsys.store import ATTACH_NAME_RE, ENDED_STATES
from rqsys.web.context import Resource, Web, queue_and_id

TAIL_CHUNK = 1024 * 1024  # a poll's most: a 5 MiB log is five polls
TAIL_START = 256 * 1024  # a page opens on the log's last this much ("load all": the rest)
LOOKUPS = 3


def check_log_name(name: str) -> str:
    if not ATTACH_NAME_RE.match(name) or ".." in name:
        raise BadRequest(f"invalid log file name: {name[:100]!r}")
    return name


def open_stored(queue_dir: Path, path: Path) -> int:
    """Open the regular file ``path`` below ``queue_dir`` for reading, following no
    symbolic link on the way (one planted in the store could point anywhere:
    ELOOP/ENOTDIR become NotFound) and never blocking on a planted FIFO."""
    parts = path.relative_to(queue_dir).parts
    fd = os.open(queue_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            step = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                           dir_fd=fd)
            os.close(fd)
            fd = step
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise  # FileNotFoundError included: the caller tells a gone message from a gone file
        raise NotFound(f"{parts[-1]} is not a file of this message") from None
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise NotFound(f"{parts[-1]} is not a file of this message")
    return leaf


def open_job_file(web: Web, queue: str, msg_id: str, name: str) -> tuple[int, str]:
    """(open fd, state) of ``job/<name>``; NotFound if the message or file is gone."""
    store = web.store(queue)
    for _ in range(LOOKUPS):
        state = store.find(msg_id)
        path = store.msg_dir(state, msg_id) / "job" / name
        try:
            return open_stored(web.layout.queue_dir(queue), path), state
        except FileNotFoundError:
            if store.msg_dir(state, msg_id).is_dir():
                raise NotFound(f"message {msg_id} has no log {name}") from None
    raise NotFound(f"message {msg_id} kept moving; try again")


def job_files(web: Web, queue: str, state: str, msg_id: str) -> list[str]:
    job = web.store(queue).msg_dir(state, msg_id) / "job"
    try:
        return sorted(p.name for p in job.iterdir() if p.is_file() and not p.is_symlink())
    except FileNotFoundError:
        return []


class LogFile(Resource):
    """``GET /q/<q>/<id>/log/<file>`` as text/plain, honouring ``Range``."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str, mid: str,
               file: str) -> None:
        queue, msg_id = queue_and_id(name, mid)
        fd, _state = open_job_file(self.web, queue, msg_id, check_log_name(file))
        send_file(req, resp, fd, falcon.MEDIA_TEXT)


def send_file(req: falcon.Request, resp: falcon.Response, fd: int, ctype: str) -> None:
    """Stream an open file (taking ownership of ``fd``), as a 206 part for a Range."""
    size = os.fstat(fd).st_size
    stream = os.fdopen(fd, "rb")
    resp.content_type = ctype
    resp.accept_ranges = "bytes"
    start, end = _range(req, size)
    if (start, end) != (0, size - 1) and req.range is not None and req.range_unit == "bytes":
        resp.status = falcon.HTTP_206
        resp.content_range = (start, end, size)
    stream.seek(start)
    resp.set_stream(_limited(stream, end - start + 1), max(0, end - start + 1))


def _range(req: falcon.Request, size: int) -> tuple[int, int]:
    wanted = req.range
    if wanted is None or size == 0 or req.range_unit != "bytes":  # another unit: ignored
        return 0, size - 1                                         # (RFC 9110 14.2)
    first, last = wanted
    if first < 0:
        first = max(0, size + first)
    last = size - 1 if last == -1 else min(last, size - 1)
    if first > last or first >= size:
        raise falcon.HTTPRangeNotSatisfiable(size)
    return first, last


def _limited(stream: Any, remaining: int) -> Any:
    with stream:
        while remaining > 0:
            chunk = stream.read(min(remaining, 1 << 16))
            if not chunk:
                return
            remaining -= len(chunk)
            yield chunk


class Tail(Resource):
    """``GET /q/<q>/<id>/tail.json?offset=N``: new output of ``job/stdio.log``.

    Answers ``{"data", "from", "offset", "size", "state", "status", "progress",
    "ended"}`` (``data``: the log from byte ``from`` to ``offset``; ``size``: the
    log's; ``progress``: ``rqsys.run.protocol.progress`` of a running one's
    status); the page polls it until ``ended`` is true (the
    message left ``run``/``que`` and all was read).  ``?last=N`` instead of
    an offset: from the start of the first line in the log's last N bytes.
    """

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str, mid: str) -> None:
        queue, msg_id = queue_and_id(name, mid)
        offset = req.get_param_as_int("offset", min_value=0, max_value=MAX_OFFSET, default=0)
        last = req.get_param_as_int("last", min_value=1, max_value=MAX_OFFSET)
        try:
            fd, state = open_job_file(self.web, queue, msg_id, "stdio.log")
        except NotFound:
            state = self.web.store(queue).find(msg_id)
            answer = {"data": "", "from": offset, "offset": offset, "size": 0, "state": state,
                      "ended": state in ENDED_STATES}
        else:
            answer = _read_tail(fd, offset if last is None else _line_start(fd, last), state)
        status = self.web.store(queue).read_status(state, msg_id)
        resp.media = dict(answer, status=status,
                          progress=protocol.progress(status) if state == "run" else None)


MAX_OFFSET = 2**62  # what a file offset holds (larger was a 500 at the seek)


def _line_start(fd: int, last: int) -> int:
    """Where the first line of the log's last ``last`` bytes begins (0: it is all)."""
    start = os.fstat(fd).st_size - last
    if start <= 0:
        return 0
    newline = os.pread(fd, min(last, 64 * 1024), start).find(b"\n")
    return start + newline + 1 if newline >= 0 else start


def _read_tail(fd: int, offset: int, state: str) -> dict[str, Any]:
    with os.fdopen(fd, "rb") as stream:
        size = os.fstat(fd).st_size
        if offset < size:  # past the end: nothing new (a seek there can fail)
            stream.seek(offset)
            data = stream.read(TAIL_CHUNK)
        else:
            data = b""
    at_end = len(data) < TAIL_CHUNK
    if not at_end:
        data = _whole_utf8(data)
    return {"data": data.decode("utf-8", "replace"), "from": offset,
            "offset": offset + len(data), "size": max(size, offset + len(data)), "state": state,
            "ended": at_end and state in ENDED_STATES}


def _whole_utf8(data: bytes) -> bytes:
    """Cut an incomplete UTF-8 sequence off the end (it is sent with the next chunk)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:  # a lead byte: keep it only if its sequence is complete
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data


def attachment_path(web: Web, queue: str, msg_id: str, name: str) -> Path:
    store = web.store(queue)
    state = store.find(msg_id)
    return store.attach_dir(state, msg_id) / name
