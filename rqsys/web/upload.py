"""Streaming attachment uploads: multipart ``filedata`` -> an unnamed temp file.

The file is created with O_TMPFILE in the queue's own ``.tmp/`` (same file
system as the store), its MD5 computed while it is written, and the open fd
is what the queue daemon receives: it hard-links the file into the message,
so nothing is copied and an abandoned upload leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import falcon

from rqsys.errors import BadRequest, StoreError
from rqsys.store import TMP_DIR, check_attach_name

CHUNK = 1 << 20
FIELD = "filedata"


@dataclass
class Upload:
    fd: int
    name: str
    md5: str
    size: int


def receive(req: falcon.Request, qdir: Path, fallback_dir: Path) -> Upload:
    """Stream the ``filedata`` part to a temp file; the caller closes ``fd``."""
    if not (req.content_type or "").lower().startswith("multipart/form-data"):
        raise BadRequest("attach needs multipart/form-data with a 'filedata' file part")
    parts = iter(req.get_media())
    for part in parts:
        if part.name != FIELD:
            part.stream.read()  # skip other fields: RQ sends only the file
            continue
        name = check_attach_name(part.filename or "")
        fd = _temp_fd(qdir / TMP_DIR, fallback_dir)
        try:
            md5, size = _copy(part.stream, fd)
            for rest in parts:  # to the closing boundary: a body cut short is a 400
                rest.stream.read()  # (its file part was taken as whatever had come)
        except BaseException:
            os.close(fd)
            raise
        return Upload(fd, name, md5, size)
    raise BadRequest(f"no '{FIELD}' file part in the upload")


def _temp_fd(primary: Path, fallback: Path) -> int:
    for where in (primary, fallback):
        try:
            where.mkdir(parents=True, exist_ok=True)
            return os.open(where, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o644)
        except OSError as err:
            last = err
    raise StoreError(f"cannot create an upload file in {primary} or {fallback}: {last}")


def _copy(stream: falcon.BoundedStream, fd: int) -> tuple[str, int]:
    digest = hashlib.md5(usedforsecurity=False)
    size = 0
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]
        size += len(chunk)
    return digest.hexdigest(), size
