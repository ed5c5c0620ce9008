"""``rq debug ID``: a message's run made again outside its queue, in a scratch directory.

The message is only read, never changed: the scratch directory gets a copy
of its ``msg``, its attachments hard-linked in ``attach/`` (copied when on
another file system), a ``job/`` to run in (``RQ_MSG_DIR``, as the daemon
gives a run its own), ``env`` with the run's environment as the queue
daemon builds it (``rqsys.run.environment``: RQ_PARAM1..4, RQ_MSG_ID,
RQ_COUNT, the queue's ``env_vars``...) and ``run.sh``, which runs the
queue's script there with it.  The script's fd 3 (its status lines) is
``status.log``; fd 4 (the answers to ``dup``) reads /dev/null, so a debug
run sends nothing into any queue.  ``--run`` runs it now (``--strace``:
under ``strace -f``, its log in ``strace.log``); ``--shell`` opens
``$SHELL`` in ``job/`` with the environment set.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rqsys.cli.common import RET_FAIL, RET_OK
from rqsys.daemon.context import QueueContext
from rqsys.errors import BadRequest
from rqsys.run.environment import RunEnvironment
from rqsys.run.spawn import script_argv
from rqsys.store import Layout, QueueStore
from rqsys.wire.client import find_message

RUN_SH = """#!/bin/sh
# rq debug: {url}, run as its queue {queue} runs it (its status lines: status.log)
cd "$(dirname "$0")" || exit 1
set -a
. ./env
set +a
cd job || exit 1
exec {argv} 3>>../status.log 4</dev/null
"""


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("msg_id", metavar="ID", help="short id or full message URL")
    parser.add_argument("--dir", help="make it here (a new or empty directory; default: a "
                        "new one under $TMPDIR)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--run", action="store_true", help="run the script there now")
    how.add_argument("--shell", action="store_true",
                     help="open $SHELL in its job/ with its environment")
    parser.add_argument("--strace", action="store_true", help="with --run: under strace -f")


def cmd_debug(layout: Layout, args: argparse.Namespace) -> int:
    if args.strace and not args.run:
        raise BadRequest("--strace goes with --run")
    queue, msg_id = find_message(layout, args.msg_id)
    scratch = _scratch(args.dir, msg_id)
    env, argv = _make(layout, queue, msg_id, scratch)
    print(f"ok {scratch}", flush=True)
    if args.shell:
        os.chdir(scratch / "job")
        shell = os.environ.get("SHELL") or "/bin/sh"
        os.execvpe(shell, [shell], {**env, "PS1": f"(rq debug {msg_id}) $ "})
    if not args.run:
        print(f"run it: {scratch}/run.sh   (or: rq debug {msg_id} --run [--strace])")
        print(f"look around: rq debug {msg_id} --shell")
        return RET_OK
    return _run(scratch, argv, args.strace)


def _scratch(where: str | None, msg_id: str) -> Path:
    if where is None:
        return Path(tempfile.mkdtemp(prefix=f"rq-debug-{msg_id}-"))
    path = Path(where)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if any(path.iterdir()):
            raise BadRequest(f"--dir {where} is not empty")
    except OSError as exc:
        raise BadRequest(f"--dir {where}: {exc.strerror or exc}") from exc
    return path.resolve()


def _make(layout: Layout, queue: str, msg_id: str,
          scratch: Path) -> tuple[dict[str, str], list[str]]:
    """The scratch directory's files; the run's environment and argv."""
    store = QueueStore(layout.queue_dir(queue))
    state = store.find(msg_id)
    msg = store.read_msg(state, msg_id)
    ctx = QueueContext.load(layout, queue)
    program, argv = script_argv(ctx.config["script"], ctx.config.get("exec_prefix") or "")
    job = scratch / "job"
    job.mkdir()
    (scratch / "msg").write_text(json.dumps(msg, indent=2, sort_keys=True) + "\n")
    _link_attachments(store.attachments(state, msg_id), scratch / "attach")
    runenv = RunEnvironment(ctx)
    env = {**runenv.shared(), **runenv.of_run(msg_id, msg, argv[-1], str(job)),
           "RQ_DEBUG": "1"}
    fd = os.open(scratch / "env", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:  # the queue's env_vars may hold secrets: yours alone
        out.write("".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()))
    run_sh = scratch / "run.sh"
    run_sh.write_text(RUN_SH.format(url=ctx.url(msg_id), queue=queue,
                                    argv=shlex.join([program, *argv[1:]])))
    run_sh.chmod(0o755)
    (scratch / "status.log").touch()
    return env, [program, *argv[1:]]


def _link_attachments(found: list[Path], into: Path) -> None:
    into.mkdir()
    for path in found:
        try:
            os.link(path, into / path.name)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM):
                raise
            shutil.copy2(path, into / path.name)  # another file system: a copy


def _run(scratch: Path, argv: list[str], strace: bool) -> int:
    """Run ``run.sh`` (under ``strace -f`` when asked); its status lines after."""
    words = [str(scratch / "run.sh")]
    if strace:
        if shutil.which("strace") is None:
            raise BadRequest("--strace: strace is not installed")
        words = ["strace", "-f", "-o", str(scratch / "strace.log"), *words]
    sys.stdout.flush()
    code = subprocess.run(words, check=False).returncode
    for line in (scratch / "status.log").read_text(errors="replace").splitlines():
        print(f"status: {line}")
    if strace:
        print(f"strace: {scratch}/strace.log")
    if code != 0:
        print(f"rq: the script exited {code} ({' '.join(argv)})", file=sys.stderr)
        return RET_FAIL
    print("ok the script exited 0")
    return RET_OK
