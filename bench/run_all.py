"""``make bench``: run every bench/bench_*.py in turn and print their figures."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

TIMEOUT = 600  # seconds per benchmark file


def main() -> int:
    here = Path(__file__).resolve().parent
    failed = []
    for path in sorted(here.glob("bench_*.py")):
        print(f"== {path.name}", flush=True)
        started = time.monotonic()
        try:
            code = subprocess.run([sys.executable, str(path)], timeout=TIMEOUT).returncode
        except subprocess.TimeoutExpired:
            code = -1
            print(f"{path.name}: timed out after {TIMEOUT}s")
        print(f"== {path.name}: exit {code} in {time.monotonic() - started:.1f}s\n", flush=True)
        if code != 0:
            failed.append(path.name)
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
