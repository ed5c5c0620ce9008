"""The README's pip recipe made true: after ``pip install`` into a venv,
``rqsys install-system --prefix P`` links ``rq``, ``rqsys`` and the man pages
into P, so that with a PATH and MANPATH holding no venv the commands run by
name, ``man`` finds every page, and the special queues (relay, webhook,
cleaner) run from the installed wheel; ``--undo`` takes back exactly its links.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import need, wait_for
from test_install import (
    HELLO,
    PAGES,
    REPO,
    _installed_package,
    _mkdir,
    _relayed,
    _status,
    copy_source,
    free_port,
    fresh_venv,
    pip_install,
)

CLEAN_PATH = "/usr/bin:/bin"


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    """A fresh venv with the wheel of this checkout pip-installed (man pages built)."""
    need(shutil.which("scdoc") is not None, "scdoc (Debian scdoc)")
    base = REPO / "build" / f"test-install-system-{os.getpid()}"
    try:
        venv = fresh_venv(base / "venv")
        done = pip_install(venv, copy_source(_mkdir(base / "src")))
        assert done.returncode == 0, done.stdout + done.stderr
        yield venv
    finally:
        shutil.rmtree(base, ignore_errors=True)


def clean_env(prefix: Path, home: Path) -> dict[str, str]:
    """Nothing of the venv or the checkout: the prefix's bin, then the system's."""
    return {"PATH": f"{prefix / 'bin'}:{CLEAN_PATH}", "HOME": str(home), "LANG": "C.UTF-8",
            "MANPATH": str(prefix / "share" / "man"), "MANPAGER": "cat", "PAGER": "cat"}


def install_system(venv: Path, prefix: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "rqsys"), "install-system", "--prefix",
                           str(prefix), *extra], capture_output=True, text=True, timeout=30)


def links_under(prefix: Path) -> list[Path]:
    return sorted(p for p in prefix.rglob("*") if p.is_symlink())


@pytest.fixture
def linked(installed: Path, tmp_path: Path) -> Iterator[Path]:
    prefix = tmp_path / "prefix"
    done = install_system(installed, prefix)
    assert done.returncode == 0, done.stderr
    yield prefix
    install_system(installed, prefix, "--undo")


# ---------------------------------------------------------------- commands and pages by name
def test_commands_and_man_pages_are_reachable_by_name(linked: Path, tmp_path: Path) -> None:
    need(shutil.which("man") is not None, "man (Debian man-db)")
    env = clean_env(linked, tmp_path)
    for command in ("rq", "rqsys"):
        done = subprocess.run([command, "--help"], env=env, capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0 and "usage:" in done.stdout, done.stderr
    found = subprocess.run(["man", "-w", "rq", "rqsys", "rq-queue-script", "rqsys.json"],
                           env=env, capture_output=True, text=True, timeout=30)
    assert found.returncode == 0, found.stderr
    # man-db names the page the link leads to
    pages = [str((linked / "share/man" / s / p).resolve()) for s, p in PAGES.items()]
    assert found.stdout.split() == pages
    page = subprocess.run(["man", "8", "rqsys"], env=env, capture_output=True, text=True,
                          timeout=30)
    assert page.returncode == 0 and "install-system" in page.stdout, page.stderr


def test_undo_removes_every_link_and_only_those(installed: Path, tmp_path: Path) -> None:
    # Given the links, and a file of the operator's beside them
    prefix = tmp_path / "prefix"
    assert install_system(installed, prefix).returncode == 0
    made = links_under(prefix)
    assert {p.name for p in made} >= {"rq", "rqsys", "rq.1", "rqsys.8"}
    assert all(p.resolve().is_relative_to(installed.resolve()) for p in made)
    (prefix / "bin" / "other").write_text("mine\n")
    # When the install is undone (twice: the second finds nothing to do)
    first, second = install_system(installed, prefix, "--undo"), \
        install_system(installed, prefix, "--undo")
    # Then no link is left, the operator's file is, and each removal was named
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert links_under(prefix) == []
    assert first.stdout.split("\n")[:-1] == [f"removed {p}" for p in made]
    assert second.stdout == ""
    assert (prefix / "bin" / "other").read_text() == "mine\n"


def test_a_path_that_is_not_our_link_is_refused(installed: Path, tmp_path: Path) -> None:
    # Given a prefix whose man1/rq.1 is someone else's link, and whose bin/rq is a file
    prefix = tmp_path / "prefix"
    _mkdir(prefix / "share/man/man1").joinpath("rq.1").symlink_to("/usr/share/man/man1/ls.1.gz")
    _mkdir(prefix / "bin").joinpath("rq").write_text("#!/bin/sh\n")
    # When install-system runs
    done = install_system(installed, prefix)
    # Then it refuses in one line, makes no link at all, and undo leaves them too
    assert done.returncode != 0
    assert len(done.stderr.splitlines()) == 1 and "is not a link to" in done.stderr, done.stderr
    assert [p.name for p in links_under(prefix)] == ["rq.1"]
    assert install_system(installed, prefix, "--undo").returncode == 0
    assert [p.name for p in links_under(prefix)] == ["rq.1"]
    assert (prefix / "bin" / "rq").read_text() == "#!/bin/sh\n"


def test_install_again_is_quiet_and_keeps_the_links(linked: Path, installed: Path) -> None:
    again = install_system(installed, linked)
    assert again.returncode == 0 and again.stdout == "", again.stdout + again.stderr


# ---------------------------------------------------------------- the special queues, by name
class Sink(BaseHTTPRequestHandler):
    """A webhook receiver: keeps each POST's JSON body."""

    bodies: list[dict[str, object]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.bodies.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, fmt: str, *args: object) -> None:
        pass


@pytest.fixture
def sink() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def served(linked: Path, installed: Path, tmp_path: Path) -> Iterator[tuple[list[str], int]]:
    """``rqsys serve`` started by name, from the links; yields (rq argv, web port)."""
    for script in (_installed_package(installed) / "scripts").glob("*.py"):
        script.chmod(0o644)  # as a wheel stores them: the exec_prefix runs them
    port, env = free_port(), clean_env(linked, tmp_path)
    root, scandir = _mkdir(tmp_path / "root"), _mkdir(tmp_path / "scandir")
    _mkdir(root / "config").joinpath("config.json").write_text(
        f'{{"host": "127.0.0.1", "addr": "127.0.0.1", "port": {port}}}')
    (_mkdir(scandir / "work") / "run").write_text(HELLO)
    (scandir / "work" / "run").chmod(0o755)
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(["rqsys", "--root", str(root), "serve", "--scandir",
                                 str(scandir), "--port", str(port)], env=env,
                                start_new_session=True, stdout=log, stderr=log)
    try:
        wait_for(lambda: all((root / "sock" / f"{q}.sock").exists()
                             for q in ("work", "relay", "webhook", "cleaner")), 30, "serve ready")
        yield [str(linked / "bin" / "rq"), "--root", str(root)], port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail("rqsys serve ignored SIGTERM")


def send(rq: list[str], *args: str) -> str:
    out = subprocess.run([*rq, "sendmesg", *args], capture_output=True, text=True,
                         timeout=30).stdout
    assert out.startswith("ok http://"), out
    return out.split()[1]


def test_special_queues_run_from_the_installed_wheel(served: tuple[list[str], int],
                                                     sink: str, installed: Path) -> None:
    rq, port = served
    # relay: a message for a queue URL is relayed to that queue
    url = send(rq, "--dest", f"http://127.0.0.1:{port}/q/work", "--relay-ok", "--param1", "r")
    far = wait_for(lambda: _relayed(rq, url), 60, "relayed").split()[3]
    wait_for(lambda: _status(rq, far) == "ok done - greeted r", 30, "relayed message done")
    # webhook: a message with post_run_webhook ends, the sink gets its body
    mesg = json.dumps({"param1": "w", "post_run_webhook": [sink]})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/q/work/new_message",
                                urllib.parse.urlencode({"mesg": mesg}).encode(), 30) as answer:
        hooked = json.load(answer)[1]
    body = wait_for(lambda: next((b for b in Sink.bodies if hooked.endswith(str(b["msg_id"]))),
                                 None), 60, "the webhook's POST")
    assert body["state"] == "done"
    # cleaner: pruning done messages of 0 days takes the relayed one away
    cleaned = send(rq, "--dest", "cleaner", "--param1", "0", "--param2", "work")
    wait_for(lambda: _status(rq, cleaned).startswith("ok done"), 30, "the cleaner done")
    assert _status(rq, far).startswith("fail"), _status(rq, far)
    # and each special queue ran the installed script, not the checkout's
    config = Path(rq[2]) / "queue"
    for name in ("relay", "webhook", "cleaner"):
        script = json.loads((config / name / "config.json").read_text())["script"]
        assert Path(script).is_relative_to(_installed_package(installed)), script


def test_a_prefix_it_cannot_write_is_one_line_not_a_traceback(installed: Path,
                                                               tmp_path: Path) -> None:
    # Given a prefix whose bin is a file, not a directory
    prefix = _mkdir(tmp_path / "prefix")
    (prefix / "bin").write_text("not a directory\n")
    # When install-system runs, then it says which link it could not make
    done = install_system(installed, prefix)
    assert done.returncode == 1, done.stdout
    assert done.stderr.startswith(f"rqsys: cannot link {prefix}/bin/rq:"), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
