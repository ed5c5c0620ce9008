"""``rqsys serve`` as a real process: what an operator sees when it cannot start."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from scan_util import LoggedProcess, clean_env, free_port


def serve(root: Path, port: int) -> subprocess.CompletedProcess[str]:
    scandir = root.parent / "scandir"
    scandir.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "rqsys", "--root", str(root), "serve",
            "--scandir", str(scandir), "--port", str(port)]
    return subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=120)


def test_a_busy_port_ends_serve_with_one_line_naming_it(tmp_path: Path) -> None:
    # Given a root whose web front end listens on loopback
    root = tmp_path / "root"
    (root / "config").mkdir(parents=True)
    (root / "config" / "config.json").write_text(json.dumps({"addr": "127.0.0.1"}))
    # and another program already listening on the port asked for
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]
        # When rqsys serve starts on that port
        done = serve(root, port)
    # Then it ends non-zero with one line that names the address, the port and why
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in lines[0]
    # and nothing was started or created before it gave up
    assert done.stdout == ""
    assert not list(root.glob("queue/*"))


def test_children_do_not_talk_to_the_supervisors_own_systemd(tmp_path: Path) -> None:
    # Given rqsys serve started with a NOTIFY_SOCKET of its own (as a unit would be)
    notify_path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(notify_path))
        root, scandir = tmp_path / "root", tmp_path / "scandir"
        scandir.mkdir()
        argv = [sys.executable, "-m", "rqsys", "--root", str(root), "serve",
                "--scandir", str(scandir), "--port", str(free_port())]
        proc = LoggedProcess(argv, tmp_path / "serve.log",
                             clean_env(NOTIFY_SOCKET=str(notify_path)))
        # When its children (web, rq-scan, queue daemons) have started and stopped
        proc.wait_log("rq-scan ready")
        assert proc.stop() == 0, proc.log()
        # Then none of them sent READY=1 or anything else to that socket
        notify.setblocking(False)
        with pytest.raises(BlockingIOError):
            notify.recv(4096)
