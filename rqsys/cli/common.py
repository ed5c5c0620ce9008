"""What ``rq`` and ``rqsys`` share: the exit codes and the ``--root`` option.

Its own module so that ``rqsys queue NAME`` (every queue daemon's start)
imports none of ``rq``'s verbs (``rqsys.cli.rq``: its client, listings, follow).
"""

from __future__ import annotations

import argparse
import os

from rqsys.errors import NotFound
from rqsys.store import Layout

RET_OK = 0  # the request succeeded
RET_FAIL = 1  # the queue answered fail (bad message, unknown id, queue down, ...)
RET_USAGE = 2  # bad command line (argparse's own code)
RET_UNAVAILABLE = 3  # the queue daemon could not be reached

ROOT_HELP = "state directory (default $RQ_ROOT or /var/lib/rq)"


def root_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default=os.environ.get("RQ_ROOT"), help=ROOT_HELP)


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
