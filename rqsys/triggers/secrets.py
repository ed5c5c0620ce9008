"""A webhook's secret, read when a request comes (a rotated secret needs no restart).

- ``{"credential": NAME}``: ``$CREDENTIALS_DIRECTORY/NAME`` of the reading
  process (under systemd: ``LoadCredential=NAME:/path`` in a drop-in of
  ``rq-web.service``);
- ``{"file": "/path"}``: that file, refused when others (neither its owner
  nor its group) may read or write it: a secret anyone on the machine can
  read signs anyone's requests.

One trailing newline (what ``echo`` leaves) is not part of the secret.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from rqsys.errors import RQError

MAX_SECRET = 64 * 1024
CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"


class SecretUnreadable(RQError):
    """A trigger's secret cannot be read, or may not be used (a file others may read)."""


def read_secret(spec: dict[str, Any]) -> bytes:
    """The secret ``spec`` names; SecretUnreadable says why not (never its value)."""
    if "credential" in spec:
        where = os.environ.get(CREDENTIALS_ENV)
        if not where:
            raise SecretUnreadable(f"credential {spec['credential']}: no {CREDENTIALS_ENV} "
                                   "(LoadCredential= of rq-web.service)")
        return _read(os.path.join(where, str(spec["credential"])),
                     f"credential {spec['credential']}", private=False)
    return _read(str(spec["file"]), "secret file", private=True)


def _read(path: str, what: str, private: bool) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise SecretUnreadable(f"{what}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretUnreadable(f"{what}: not a regular file")
        if private and st.st_mode & 0o007:
            raise SecretUnreadable(f"{what}: others may read or write it (mode "
                                   f"{stat.S_IMODE(st.st_mode):04o}): chmod o= it")
        data = os.read(fd, MAX_SECRET + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET:
        raise SecretUnreadable(f"{what}: longer than {MAX_SECRET} bytes")
    return data[:-1] if data.endswith(b"\n") else data
