"""What ``rq`` and ``rqsys`` share: the exit codes and the ``--root`` option.

Its own module so that ``rqsys queue NAME`` (every queue daemon's start)
imports none of ``rq``'s verbs (``rqsys.cli.rq``: its client, listings, follow).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Iterable

from rqsys import __version__
from rqsys.errors import NotFound
from rqsys.store import Layout

RET_OK = 0  # the request succeeded
RET_FAIL = 1  # the queue answered fail (bad message, unknown id, queue down, ...)
RET_USAGE = 2  # bad command line (argparse's own code)
RET_UNAVAILABLE = 3  # the queue daemon could not be reached

ROOT_HELP = "state directory (default $RQ_ROOT or /var/lib/rq)"


def root_option(parser: argparse.ArgumentParser) -> None:
    """``--root`` (default $RQ_ROOT), and ``--version``."""
    parser.add_argument("--root", default=os.environ.get("RQ_ROOT"), help=ROOT_HELP)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def parser_verbs(parser: argparse.ArgumentParser) -> list[str]:
    """The verbs of a parser made with ``add_subparsers``."""
    return [name for action in parser._actions  # argparse keeps its subparsers only there
            if isinstance(action, argparse._SubParsersAction) for name in action.choices]


def check_verb(prog: str, argv: list[str], verbs: Iterable[str]) -> None:
    """A mistyped verb: one line with the nearest verbs (argparse lists them all), exit 2."""
    words = iter(argv)
    for word in words:
        if len(word) > 3 and "--root".startswith(word):  # argparse takes --ro for --root
            next(words, None)
        elif not word.startswith("-"):
            if word in verbs:
                return
            near = difflib.get_close_matches(word, list(verbs), n=3)
            hint = (f": did you mean {' or '.join(near)}?" if near
                    else f" ({prog} --help lists them)")
            print(f"{prog}: unknown verb {word!r}{hint}", file=sys.stderr)
            raise SystemExit(RET_USAGE)


def queue_argument(parser: argparse.ArgumentParser) -> None:
    """The queue a verb acts on, given the same way in every verb: ``QUEUE`` or
    ``--queue QUEUE`` (RQ's spelling); ``one_queue`` checks one was given."""
    parser.add_argument("queue", nargs="?", metavar="QUEUE", help="the queue")
    parser.add_argument("--queue", dest="queue_option", metavar="QUEUE",
                        help="the queue (the same as QUEUE)")


def one_queue(prog: str, args: argparse.Namespace) -> None:
    """``args.queue`` from ``QUEUE`` or ``--queue``: a usage error (exit 2) when
    neither or two different ones were given."""
    given = {q for q in (args.queue, args.queue_option) if q}
    if len(given) != 1:
        said = "two queues" if given else "no queue"
        print(f"{prog} {args.verb}: {said}: name one, as QUEUE or --queue QUEUE",
              file=sys.stderr)
        raise SystemExit(RET_USAGE)
    args.queue = given.pop()


def say_failure(prog: str, why: object) -> None:
    """RQ's ``fail <why>`` on stdout (what scripts read), and ``prog: why`` on
    stderr for logs; once, not twice, when both go to the same place (a
    terminal, or ``2>&1`` into one file or pipe)."""
    print(f"fail {why}", flush=True)
    if not _one_place():
        print(f"{prog}: {why}", file=sys.stderr)


def _one_place() -> bool:
    """Whether stdout and stderr are the same file, pipe or terminal."""
    try:
        return os.path.samestat(os.fstat(1), os.fstat(2))
    except OSError:
        return False


def existing_root(root: str | None) -> Layout:
    """The layout of the state directory a client verb reads (``--root``, else
    $RQ_ROOT, else /var/lib/rq); NotFound naming it and how to set it when it is
    not there (a missing root made every queue "no queue named ...")."""
    layout = Layout.from_root(root)
    if not layout.queues.is_dir():
        raise NotFound(f"no rqsys state directory at {layout.root}: pass --root DIR or set "
                       "RQ_ROOT to the one rqsys serves (make run prints it)")
    return layout


def after_verb() -> argparse.ArgumentParser:
    """--root accepted after the verb too (``rqsys serve --root DIR``)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--root", default=argparse.SUPPRESS, help=ROOT_HELP)
    return parent
