"""The ``rqsys`` command line: the daemons (serve, queue, web, scan, timer,
relay-worker) and admin verbs (passwd, queue-owner, install-units, install-system,
backup, restore).

Each subcommand imports its module only when run, so the daemons start fast;
``--root`` and the exit codes are shared with ``rq`` (``rqsys.cli.common``),
whose verbs (``rqsys.cli.rq``) it never imports.  ``python -m rqsys``
runs it (the supervisor starts its children so).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rqsys.cli.common import (
    RET_FAIL,
    RET_OK,
    after_verb,
    check_verb,
    parser_verbs,
    root_option,
)
from rqsys.errors import RQError
from rqsys.store import Layout, formats
from rqsys.store.formats import EXIT_NEWER, FormatError


def rqsys_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rqsys", description="rqsys daemons and admin")
    root_option(parser)
    cmds = parser.add_subparsers(dest="cmd", required=True)
    root = [after_verb()]
    serve = cmds.add_parser("serve", help="embedded mode: every daemon under one supervisor",
                            parents=root)
    serve.add_argument("--scandir", type=Path, help="queue scripts directory")
    _web_options(serve)
    queue = cmds.add_parser("queue", help="run one queue daemon (rq@NAME.service)", parents=root)
    queue.add_argument("name")
    owner = cmds.add_parser("queue-owner", help="hand a queue's directory to its config's "
                            "user (ExecStartPre=+ of rq@NAME.service)", parents=root)
    owner.add_argument("name")
    _web_options(cmds.add_parser("web", help="run the web front end (rq-web.service)",
                                 parents=root))
    passwd = cmds.add_parser("passwd", help="hash a web password for basic_auth", parents=root)
    passwd.add_argument("user", nargs="?", default="admin", help="user name (default: admin)")
    passwd.add_argument("--role", choices=("viewer", "operator", "admin"),
                        help="what the user may do (default: admin)")
    passwd.add_argument("--queues", nargs="+", metavar="GLOB",
                        help="the queues the user sees and acts on (default: all)")
    scan = cmds.add_parser("scan", help="watch the scandir and timers (rq-scan.service)",
                           parents=root)
    scan.add_argument("--scandir", type=Path, help="default <root>/scandir")
    timer = cmds.add_parser("timer", help="send a calendar or cron timer's latest slot "
                            "(rq-timer@NAME.service)", parents=root)
    timer.add_argument("name")
    cmds.add_parser("relay-worker", help="relay the relay queue's messages on its socket "
                    "(rq-relay-worker.service)", parents=root)
    units = cmds.add_parser("install-units", help="install the systemd units, sysusers, tmpfiles",
                            parents=root)
    units.add_argument("--prefix", type=Path, help="write under this root; no systemctl")
    units.add_argument("--exec", dest="executable", help="rqsys path in ExecStart= (default: this)")
    _backup_parsers(cmds, root)
    system = cmds.add_parser("install-system", help="link rq, rqsys, man pages into a prefix",
                             parents=root)
    system.add_argument("--prefix", type=Path, help="default /usr/local")
    system.add_argument("--undo", action="store_true", help="remove the links made")
    return parser


def _backup_parsers(cmds: Any, root: list[argparse.ArgumentParser]) -> None:
    """``backup DEST`` and ``restore SRC ROOT`` (``rqsys.backup``)."""
    backup = cmds.add_parser("backup", help="copy the root, live, into DEST: each message once, "
                             "in a state it had", parents=root)
    backup.add_argument("dest", type=Path, metavar="DEST", help="a new or empty directory")
    restore = cmds.add_parser("restore", help="check a backup and put it in place in ROOT",
                              parents=root)
    restore.add_argument("src", type=Path, metavar="SRC", help="a directory rqsys backup made")
    restore.add_argument("target", type=Path, metavar="ROOT", help="the state root to fill")
    restore.add_argument("--force", action="store_true",
                         help="replace what a non-empty ROOT holds (its daemons stopped)")


def _web_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", metavar="ADDR:PORT",
                        help="web address (default: config.json's addr:port, 127.0.0.1:3333; "
                             "IPv6 as [::1]:3333)")
    parser.add_argument("--port", type=int, help="web port only (the address from config.json)")
    parser.add_argument("--allow-unauthenticated-network", dest="allow_unauthenticated",
                        action="store_true",
                        help="serve a non-loopback address without basic_auth (anyone who "
                             "reaches it can run scripts; a warning is logged at every start)")


def _listen_of(args: argparse.Namespace) -> tuple[str | None, int | None]:
    """(addr, port) from --listen / --port; None where config.json decides."""
    from rqsys.web.listen import parse_listen

    if args.listen is None:
        return None, args.port
    addr, port = parse_listen(args.listen)
    return addr, port if args.port is None else args.port


def rqsys_main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = rqsys_parser()
    check_verb("rqsys", argv, parser_verbs(parser))
    args = parser.parse_args(argv)
    try:
        layout = Layout.from_root(args.root)
        if args.cmd in WRITERS:
            _ensure_format(layout)
        return RQSYS_COMMANDS[args.cmd](layout, args)
    except FormatError as exc:
        print(f"rqsys: {exc}", file=sys.stderr)
        return EXIT_NEWER
    except RQError as exc:
        print(f"rqsys: {exc}", file=sys.stderr)
        return RET_FAIL


def _ensure_format(layout: Layout) -> None:
    """The root in this rqsys's on-disk format before anything opens it (a
    new root stamped, an older one migrated: ``rqsys.store.formats``)."""
    formats.ensure(layout.root, lambda text: print(f"rqsys: {text}", file=sys.stderr))


def run_serve(layout: Layout, args: argparse.Namespace) -> int:
    from rqsys import supervisor

    addr, port = _listen_of(args)
    options = supervisor.WebOptions(addr, port, args.allow_unauthenticated)
    return supervisor.main(layout, args.scandir, options)


def run_queue(layout: Layout, args: argparse.Namespace) -> int:
    from rqsys.daemon import main

    return main.main(layout, args.name)


def run_queue_owner(layout: Layout, args: argparse.Namespace) -> int:
    from rqsys.run import unituser

    return unituser.main(layout, args.name)


def run_web(layout: Layout, args: argparse.Namespace) -> int:
    from rqsys.web import app

    addr, port = _listen_of(args)
    return int(app.main(layout, addr, port, args.allow_unauthenticated))


def run_passwd(layout: Layout, args: argparse.Namespace) -> int:
    from rqsys.web import passwd

    return passwd.main(args.user, args.role, args.queues)


def run_scan(layout: Layout, args: argparse.Namespace) -> int:
    from rqsys.scan import watcher

    return int(watcher.main(layout, args.scandir or layout.scandir))


def run_timer(layout: Layout, args: argparse.Namespace) -> int:
    from rqsys.timers import units as timer_units

    print(f"ok {timer_units.send_slot(layout, args.name)}")
    return RET_OK


def run_relay_worker(layout: Layout, args: argparse.Namespace) -> int:
    from rqsys.scripts import relayworker

    return relayworker.main()


def run_install_units(layout: Layout, args: argparse.Namespace) -> int:
    from rqsys.install import units

    return units.main(args.prefix, args.executable)


def run_install_system(layout: Layout, args: argparse.Namespace) -> int:
    from rqsys.install import system

    return system.main(args.prefix, args.undo)


def run_backup(layout: Layout, args: argparse.Namespace) -> int:
    from rqsys.backup import copy

    print(copy.backup(layout, args.dest))
    return RET_OK


def run_restore(layout: Layout, args: argparse.Namespace) -> int:
    from rqsys.backup import restore

    print(restore.restore(args.src, args.target, args.force))
    return RET_OK


# The commands that open a root to change it: each first makes its format current.
WRITERS = ("serve", "queue", "web", "scan")
RQSYS_COMMANDS: dict[str, Callable[[Layout, argparse.Namespace], int]] = {
    "serve": run_serve,
    "queue": run_queue,
    "queue-owner": run_queue_owner,
    "web": run_web,
    "scan": run_scan,
    "install-units": run_install_units,
    "timer": run_timer,
    "relay-worker": run_relay_worker,
    "passwd": run_passwd,
    "install-system": run_install_system,
    "backup": run_backup,
    "restore": run_restore,
}
