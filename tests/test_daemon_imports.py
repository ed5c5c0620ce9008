"""What the queue daemon's start imports: nothing it needs only on a rare path.

An idle daemon's RSS is mostly its imports (one per queue on a host); these
pin the lazy ones (docs/BENCHMARKS.md, "daemon RSS")."""

from __future__ import annotations

import subprocess
import sys

START = "import sys, rqsys.cli, rqsys.cli_rqsys, rqsys.daemon; print(' '.join(sorted(sys.modules)))"


def _modules_at_start() -> set[str]:
    done = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True,
                          check=True, timeout=60)
    return set(done.stdout.split())


def test_the_queue_daemon_starts_without_libcrypto_falcon_or_the_web() -> None:
    # Given the modules `rqsys queue NAME` (through rqsys.cli) loads before its loop runs
    loaded = _modules_at_start()
    # Then hashlib (OpenSSL's libcrypto: 3.5 MiB resident) waits for an attachment or an
    # err's group, and nothing of the web front end comes in
    assert not {"hashlib", "_hashlib", "ssl", "falcon", "waitress"} & loaded
    assert not [name for name in loaded if name.startswith("rqsys.web")]
