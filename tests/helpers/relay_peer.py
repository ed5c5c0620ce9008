"""A tiny RQ peer for relay tests: RQ's HTTP contract for prep/attach/commit, on disk.

Run as ``python relay_peer.py DIR ADDR PORT`` (inside a test namespace).  It
speaks RQ's dialect as RQ's ``code/main.rb`` does: ``_method`` is read from
*inside* the ``mesg`` JSON (a ``_method`` form field beside it is ignored),
a post without ``x_format=json`` is answered with an HTML redirect, and a
commit or upload for a message not in prep is ``["fail", "cannot find
message"]`` with status 200.  It keeps each message under
``DIR/q/<queue>/<id>/`` (``msg.json``, ``state``, ``attach/<name>``) so the
test reads what arrived, and it misbehaves on request: ``DIR/faults.json``
may hold ``{"fail_503": N}`` (answer 503 N times), ``{"corrupt": true}``
(damage each upload), ``{"drop_commit": N}`` (commit, then close without
answering, N times), ``{"attach_503": N}`` (refuse N uploads),
``{"no_state": true}`` (message JSON without ``state``: ask
``<msg>/state.json``, which answers ``["ok", state]``), ``{"ignore_prep":
true}`` (an RQ that queues at once whatever ``_method`` says),
``{"lose_attachments": true}`` (the commit drops what was uploaded),
``{"stall_commit": N}`` (a commit writes ``DIR/stalled``, waits for
``DIR/unstall``, then answers 503 without committing, N times),
``{"vanish_at_commit": N}`` (a commit loses the prepared message and
answers RQ's "cannot find message"), ``{"vanish_at_attach": N}`` (the same
at an upload; ``{"vanish_at_attach_404": N}``: answered 404, as rqsys
does), ``{"attachments_list": N}`` (message JSON whose ``_attachments`` is
a list), ``{"unicode_prep": N}`` (a prep answers a URL whose path is not
ASCII).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

LOCK = threading.Lock()
IDS = itertools.count(1)
USED: dict[tuple[str, str], int] = {}  # (faults.json's version, fault) -> times used
QUEUES = ("work",)  # the only queue this peer has


class Peer(BaseHTTPRequestHandler):
    base: Path
    url: str

    def log_message(self, fmt: str, *args: object) -> None:
        print(fmt % args, file=sys.stderr, flush=True)

    # -- faults ----------------------------------------------------------------
    def fault(self, name: str) -> bool:
        """True when fault ``name`` is on (a counted one is used up by one).

        ``faults.json`` is the test's alone (it replaces it whole); what a
        counted fault has used is kept here per version of that file and
        shown in ``faults.used.json``.  (The peer once wrote the decremented
        counts back into faults.json, and a test's new faults written
        between its read and its write were lost.)"""
        with LOCK:
            path = self.base / "faults.json"
            try:
                stat = path.stat()
                version = f"{stat.st_ino}:{stat.st_mtime_ns}"  # an inode is reused
                faults = json.loads(path.read_text())
            except FileNotFoundError:
                return False
            value = faults.get(name)
            if not value:
                return False
            if value is True:
                return True
            used = USED.get((version, name), 0)
            if used >= value:
                return False
            USED[(version, name)] = used + 1
            shown = self.base / "faults.used.tmp"
            counts = {fault: n for (v, fault), n in USED.items() if v == version}
            shown.write_text(json.dumps({"version": version, **counts}))
            shown.replace(self.base / "faults.used.json")
            return True

    def answer(self, status: int, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def msg_dir(self, queue: str, msg_id: str) -> Path:
        return self.base / "q" / queue / msg_id

    # -- routes -----------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        parts = self.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "q" and parts[2].endswith(".json"):
            self.get_json(parts[1], parts[2][:-5])
            return
        if len(parts) == 4 and parts[0] == "q" and parts[3] == "state.json":
            state = self.msg_dir(parts[1], parts[2]) / "state"
            if state.exists():
                self.answer(200, ["ok", state.read_text()])
                return
        self.answer(404, ["fail", "no such route"])

    def get_json(self, queue: str, msg_id: str) -> None:
        mdir = self.msg_dir(queue, msg_id)
        if not (mdir / "state").exists():
            self.answer(404, ["fail", "no such message"])
            return
        attach = {p.name: {"md5": hashlib.md5(p.read_bytes()).hexdigest(),
                           "size": p.stat().st_size}
                  for p in sorted((mdir / "attach").glob("*"))}
        doc = dict(json.loads((mdir / "msg.json").read_text()), _attachments=attach)
        if self.fault("attachments_list"):
            doc["_attachments"] = list(attach) or ["x"]
        if not self.fault("no_state"):
            doc["state"] = (mdir / "state").read_text()
        self.answer(200, doc)

    def do_POST(self) -> None:  # noqa: N802
        if self.fault("fail_503"):
            self.read_all()
            self.answer(503, ["fail", "queue is DOWN"])
            return
        parts = self.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "q" and parts[2] == "new_message":
            self.new_message(parts[1])
        elif len(parts) == 5 and parts[0] == "q" and parts[3:] == ["attach", "new"]:
            self.attach(parts[1], parts[2])
        elif len(parts) == 3 and parts[0] == "q":
            self.commit(parts[1], parts[2])
        else:
            self.answer(404, ["fail", "no such route"])

    def read_all(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def form(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(self.read_all().decode()).items()}

    def html_redirect(self) -> None:
        """What RQ answers a post without x_format=json: a page, not JSON."""
        body = b"<html><body>Redirecting</body></html>"
        self.send_response(302)
        self.send_header("Location", "/")
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def new_message(self, queue: str) -> None:
        form = self.form()
        if queue not in QUEUES:
            self.answer(404, ["fail", f"no queue named {queue}"])
            return
        msg = json.loads(form["mesg"])
        method = msg.pop("_method", "commit")  # RQ: prms.fetch('_method', 'commit')
        msg_id = time.strftime("%Y%m%d.%H%M.%S.000.") + str(next(IDS))
        mdir = self.msg_dir(queue, msg_id)
        (mdir / "attach").mkdir(parents=True)
        (mdir / "msg.json").write_text(json.dumps(msg))
        prep = method == "prep" and not self.fault("ignore_prep")
        (mdir / "state").write_text("prep" if prep else "que")
        if form.get("x_format", "json") != "json":
            self.html_redirect()
            return
        odd = "\u20ac/" if self.fault("unicode_prep") else ""
        self.answer(200, ["ok", f"{self.url}{odd}q/{queue}/{msg_id}"])

    def attach(self, queue: str, msg_id: str) -> None:
        mdir = self.msg_dir(queue, msg_id)
        if self.fault("attach_503"):
            self.read_all()
            self.answer(503, ["fail", "try again later"])
            return
        if self.fault("vanish_at_attach"):
            shutil.rmtree(mdir)
        if self.fault("vanish_at_attach_404"):
            shutil.rmtree(mdir)
            self.read_all()
            self.answer(404, ["fail", "no such message"])
            return
        if not (mdir / "state").exists() or (mdir / "state").read_text() != "prep":
            self.read_all()
            self.answer(200, ["fail", "cannot find message"])
            return
        fields, name, md5 = self.receive_file(mdir / "attach")
        if self.fault("corrupt"):
            md5 = corrupt(mdir / "attach" / name)
        if fields.get("x_format") != "json":
            self.html_redirect()
            return
        self.answer(200, ["ok", f"{md5}-Attached successfully"])

    def receive_file(self, adir: Path) -> tuple[dict[str, str], str, str]:
        """Stream a multipart upload: text fields, then one file part, into ``adir``."""
        left = int(self.headers["Content-Length"])
        boundary = self.headers["Content-Type"].split("boundary=")[1]
        fields: dict[str, str] = {}
        while True:
            head = b""
            while b"\r\n\r\n" not in head:
                head += self.rfile.read(1)
            left -= len(head)
            if b'filename="' in head:
                break
            field = head.split(b'name="')[1].split(b'"')[0].decode()
            value = self.rfile.readline()  # "json\r\n"
            left -= len(value)
            fields[field] = value.decode().strip()
        name = head.split(b'filename="')[1].split(b'"')[0].decode()
        tail = len(f"\r\n--{boundary}--\r\n")
        digest = hashlib.md5()
        with open(adir / name, "wb") as out:
            size = left - tail
            while size:
                chunk = self.rfile.read(min(size, 1 << 20))
                digest.update(chunk)
                out.write(chunk)
                size -= len(chunk)
        self.rfile.read(tail)
        return fields, name, digest.hexdigest()

    def commit(self, queue: str, msg_id: str) -> None:
        form = self.form()
        mdir = self.msg_dir(queue, msg_id)
        if form.get("_method") != "commit":
            self.answer(400, ["fail", "400 - Invalid method param"])
            return
        if self.fault("vanish_at_commit"):
            shutil.rmtree(mdir)
        if not (mdir / "state").exists() or (mdir / "state").read_text() != "prep":
            self.answer(200, ["fail", "cannot find message"])
            return
        if self.fault("stall_commit"):
            self.stall()
            return
        (mdir / "state").write_text("que")
        if self.fault("lose_attachments"):
            for path in (mdir / "attach").iterdir():
                path.unlink()
        if self.fault("drop_commit"):
            self.close_connection = True
            return  # committed, but the answer is lost
        if form.get("x_format") != "json":
            self.html_redirect()
            return
        self.answer(200, ["ok", "msg commited"])

    def stall(self) -> None:
        """Hold the request until the test writes ``unstall`` (30 s at most), then 503."""
        (self.base / "stalled").write_text("1")
        deadline = time.monotonic() + 30
        while not (self.base / "unstall").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.answer(503, ["fail", "stalled"])


def corrupt(path: Path) -> str:
    """Flip the first byte of ``path`` (damage in transit); its new MD5."""
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(data)
    return hashlib.md5(data).hexdigest()


def main() -> None:
    base, addr, port = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    Peer.base, Peer.url = base, f"http://{addr}:{port}/"
    server = ThreadingHTTPServer((addr, port), Peer)
    (base / "ready").write_text("1")
    server.serve_forever()


if __name__ == "__main__":
    main()
