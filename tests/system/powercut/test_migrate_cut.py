"""A power cut in the middle of a migration of the root's format loses nothing, and the
next start finishes it.

Debian's kernel under QEMU runs rqsys on ext4 with its clients until they have
acknowledgements, stops it cleanly, takes the root back to format 0 (no
``format.json``: as every rqsys before 0.2.0 left it) and migrates it with
``formats.ensure``, the guest cutting its own power (``echo b >
/proc/sysrq-trigger``) at one point of the migration, an image each:
``after-step`` (the step done, its version not written) and ``in-stamp`` (the
version's temp file written and synced, not renamed).  The next boot checks
the file system, starts rqsys (each program's start migrates) and compares
the disk with every acknowledgement and ``format.json`` with this rqsys's
format (see README.md, "A cut in a migration").
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import qemu_vm  # noqa: E402  (tests/helpers/, on the path by pyproject.toml)
import run  # noqa: E402
from conftest import need  # noqa: E402
from guest_runs import MIGRATE_CUTS  # noqa: E402


def test_a_power_cut_in_a_migration_loses_nothing_and_the_next_start_finishes_it(
        guests: dict[str, Any]) -> None:
    # Given rqsys on ext4 with acknowledged messages, stopped, its root back at format 0
    outcome = guests["migrate"]
    need(not outcome.missing, outcome.missing)
    print(f"powercut: QEMU with {qemu_vm.accel_report()}")
    # When the guest cuts its power in the migration (after the step; in the version's
    # stamp) and the kernel boots again, rqsys starting on the root
    found: list[run.Tally] = list(outcome.get())
    out = io.StringIO()
    run.report(found, out)
    text = out.getvalue()
    print(text)
    # Then both cut points were reached, every acknowledged message is there, intact,
    # and the start finished the migration: format.json says this rqsys's format, by it
    assert sorted(p for t in found for p in t.migrate_cuts) == sorted(MIGRATE_CUTS), text
    assert all(t.clean() for t in found), text
    assert all(t.cuts == 1 and t.acked > 0 for t in found), text
    assert all(len(t.formats) == 1 and t.formats[0]["ok"] for t in found), text
