"""A queue's socket asked by another user, as the kernel will name it: the
role groups made where the host lacks them, and a client run by ``setpriv``
as user nobody in chosen groups (the socket role tests)."""

from __future__ import annotations

import grp
import json
import os
import subprocess
from collections.abc import Iterator

import pytest

NOBODY = 65534
CLIENT = """if 1:
    import json, socket, sys
    s = socket.socket(socket.AF_UNIX)
    s.connect("q.sock")
    f = s.makefile("rwb")
    for line in sys.argv[1:]:
        f.write(line.encode() + b"\\n"); f.flush()
        print(f.readline().decode().strip())
"""


@pytest.fixture(scope="module")
def groups() -> Iterator[dict[str, int]]:
    """The groups rqsys's roles name (made for the test when the host lacks them)."""
    made = []
    for name in ("rq-view", "rq"):
        try:
            grp.getgrnam(name)
        except KeyError:
            subprocess.run(["groupadd", "--system", name], check=True)
            made.append(name)
    try:
        yield {name: grp.getgrnam(name).gr_gid for name in ("rq-view", "rq")}
    finally:
        for name in made:
            subprocess.run(["groupdel", name], check=False)


def ask_as(layout, gids: list[int], *requests: dict) -> list[dict]:
    """The answers to ``requests`` on queue q's socket, sent by a process of
    user nobody in ``gids``."""
    os.chmod(layout.socket_path("q"), 0o666)  # rq@.socket's SocketMode
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
            "--groups=" + ",".join(map(str, gids)) if gids else "--clear-groups",
            "/usr/bin/python3", "-c", CLIENT, *(json.dumps(r) for r in requests)]
    done = subprocess.run(argv, cwd=layout.socket_dir, capture_output=True, text=True,
                          timeout=60, check=True)
    return [json.loads(line) for line in done.stdout.splitlines()]
