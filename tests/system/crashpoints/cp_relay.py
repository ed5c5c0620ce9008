"""The relay's crash points: the relay queue's daemon killed while its scripts upload and commit.

One far end serves every point: a real ``rqsys serve`` on loopback
(:class:`FarEnd`, queue ``far``, whose script says ``done``).  Each point's
root has the built-in ``relay`` queue; the client creates messages there
whose ``dest`` is the far queue's URL (plain, with attachments, one
prepared then attached and committed), and the daemon under strace runs
the relay scripts (RQ's two phases over HTTP) while strace kills it at one
of its write-side calls; its scripts are killed with it.  After the
restart, every acknowledged message must end ``relayed`` and the far end
must hold exactly one committed copy of it (found by ``orig_msg_id``),
with the same params and attachments (MD5); a prepared copy left by a
crash between the far end's answer and the note of its URL never runs and
is allowed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from cp_checker import Verdict, scan
from cp_scenario import Acks, Client, Layout, wait_final

from rqsys.special import RELAY_QUEUE, special_config

FAR_QUEUE = "far"
COMMITTED = ("que", "run", "done", "err")
_ports = itertools.count(20000)  # each point's own host port: ids are unique per host only


class FarEnd:
    """``rqsys serve`` on 127.0.0.1 with the queue ``far``; one for a whole run."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="rq-crashpoint-far-"))
        self.root, scandir = self.base / "root", self.base / "scandir"
        entry = self.base / "far-script"
        for path in (self.root, scandir, entry):
            path.mkdir()
        (entry / "run").write_text('#!/bin/bash\necho "done arrived" >&3\n')
        (entry / "run").chmod(0o755)
        (scandir / FAR_QUEUE).symlink_to(entry)
        self.port = _free_port()
        env = {k: v for k, v in os.environ.items()
               if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM", "LISTEN_FDS", "LISTEN_PID")}
        with open(self.base / "serve.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rqsys", "--root", str(self.root), "serve",
                 "--scandir", str(scandir), "--listen", f"127.0.0.1:{self.port}"],
                env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self._wait_up()

    @property
    def queue_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/q/{FAR_QUEUE}"

    def _wait_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"far rqsys serve ended: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.queue_url}.json", timeout=2) as answer:
                    if json.load(answer).get("status") == "UP":
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"far rqsys serve not up in {timeout}s: {self.log_tail()}")

    def log_tail(self) -> str:
        return (self.base / "serve.log").read_text(errors="replace")[-2000:]

    def copies(self) -> dict[str, list[tuple[str, Path]]]:
        """orig_msg_id -> [(state, dir)] of every far message."""
        found: dict[str, list[tuple[str, Path]]] = {}
        for places in scan(self.root / "queue" / FAR_QUEUE).values():
            for state, mdir in places:
                orig = _msg(mdir).get("orig_msg_id")
                found.setdefault(str(orig), []).append((state, mdir))
        return found

    def close(self) -> None:
        """SIGTERM the supervisor (it ends its children), then its session."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass
        subprocess.run(["rm", "-rf", str(self.base)], check=False)


def _free_port() -> int:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


def make_relay_queue(layout: Layout) -> None:
    """The built-in relay queue in this point's root, on a host URL of its own."""
    port = next(_ports)
    layout.config_file.write_text(json.dumps({"host": "127.0.0.1", "port": port}))
    cfg = special_config(RELAY_QUEUE)
    cfg["env_vars"] = dict(cfg.get("env_vars") or {}, RELAY_TIMEOUT="10")
    layout.create_queue_dir(RELAY_QUEUE, cfg)


def work_for(far: FarEnd):  # noqa: ANN201 - a workload for run_workload
    """Relay two plain messages, one with two attachments, one prepared then committed."""

    def relay(client: Client) -> None:
        dest = far.queue_url
        client.create("r", "relay-plain-1", dest=dest)
        client.create("r", "relay-attached", dest=dest,
                      files={"one.bin": os.urandom(4000), "two.bin": os.urandom(100)})
        prep = client.create("r", "relay-prep", state="prep", dest=dest)
        client.attach(prep, "late.bin", os.urandom(3000))
        client.commit(prep)
        client.create("r", "relay-plain-2", dest=dest)
        wait_final(client)

    return relay


def check_far(far: FarEnd, layout: Layout, acks: Acks) -> Verdict:
    """Every acknowledged message relayed once, whole, to the far end."""
    verdict, copies = Verdict(), far.copies()
    here = scan(layout.queue_dir(RELAY_QUEUE))
    for msg_id, exp in acks.messages.items():
        states = [s for s, _ in here.get(msg_id, [])]
        if "relayed" not in states:
            continue  # cp_checker.check says what is wrong with it
        mine = [c for o, cs in copies.items() if o.endswith(f"/{msg_id}") and
                o.startswith(_host_of(layout)) for c in cs]
        committed = [(s, d) for s, d in mine if s in COMMITTED]
        tag = exp.msg.get("param2")
        if not committed:
            verdict.lost.append(f"{msg_id} ({tag}): relayed, far end has no committed copy "
                                f"({[s for s, _ in mine]})")
        elif len(committed) > 1:
            verdict.corrupted.append(f"{msg_id} ({tag}): {len(committed)} committed copies "
                                     "at the far end")
        elif why := _far_differs(exp.msg, exp.attach, committed[0][1]):
            verdict.corrupted.append(f"{msg_id} ({tag}): far copy {why}")
    return verdict


def _host_of(layout: Layout) -> str:
    cfg = json.loads(layout.config_file.read_text())
    return f"http://{cfg['host']}:{cfg['port']}/"


def _far_differs(msg: dict[str, str], attach: dict[str, str], mdir: Path) -> str:
    far = _msg(mdir)
    bad = [k for k in ("param1", "param2", "param3") if far.get(k) != msg.get(k)]
    if bad:
        return f"fields differ: {', '.join(bad)}"
    for name, md5 in attach.items():
        try:
            got = hashlib.md5((mdir / "attach" / name).read_bytes()).hexdigest()
        except OSError:
            return f"lacks attachment {name}"
        if got != md5:
            return f"attachment {name}: MD5 {got}"
    return ""


def _msg(mdir: Path) -> dict[str, object]:
    try:
        data = json.loads((mdir / "msg").read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}

