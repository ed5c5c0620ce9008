"""What the queue daemon's start imports: nothing it needs only on a rare path.

An idle daemon's RSS is mostly its imports (one per queue on a host); these
pin the lazy ones (docs/BENCHMARKS.md, "daemon RSS")."""

from __future__ import annotations

import subprocess
import sys

PRINT = "; print(' '.join(sorted(sys.modules)))"


def _modules_at_start(entry: str) -> set[str]:
    code = f"import sys, {entry}, rqsys.daemon.main" + PRINT
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    return set(done.stdout.split())


def test_rqsys_queue_imports_none_of_the_rq_verbs() -> None:
    # Given the modules `rqsys queue NAME` (rq@NAME.service, `rqsys serve`'s children) loads
    loaded = _modules_at_start("rqsys.cli.admin")
    # Then none of rq's client verbs, listings or follow come in
    assert not {"rqsys.cli.rq", "rqsys.cli.jobs", "rqsys.cli.observe", "rqsys.cli.follow"} & loaded


def test_the_queue_daemon_starts_without_libcrypto_falcon_or_the_web() -> None:
    # Given the modules the daemon loads before its loop runs, even through `-m rqsys`
    loaded = _modules_at_start("rqsys.cli.admin")
    # Then hashlib (OpenSSL's libcrypto: 3.5 MiB resident) waits for an attachment or an
    # err's group, and nothing of the web front end comes in
    assert not {"hashlib", "_hashlib", "ssl", "falcon", "waitress"} & loaded
    assert not [name for name in loaded if name.startswith("rqsys.web")]
