"""Before/after figures in one run: one benchmark, two builds, alternated.

    python bench/ab.py [--rounds 3] [--bench bench_queue.py] BEFORE_DIR AFTER_DIR [SECTION...]

The benchmark file is AFTER_DIR's; each side runs it with its own venv
(``<dir>/.venv/bin/python``, an editable install: ``make install`` there
first), so the same measurement meets two builds of rqsys; SECTIONs are
passed to it (bench_queue.py: enqueue, e2e, latency, startup).  Before,
after, before, after...  Alternating makes both sides share the machine's load and
the disk's recent past (see scratch.py), which on a shared 2-core machine
moves a figure more than most changes do.  Every numeric figure the
benchmark reports is printed with each side's median and range over the
rounds, and the after/before ratio of the medians.  The spread between
rounds is the yardstick a change is judged by: a figure is "worse" only when
the after range lies wholly below (or, for times and sizes, above) the
before range.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

FIGURE = re.compile(r"^(?P<name>\S.*?)\s{2,}(?P<value>-?[\d.]+)\s*(?P<unit>[^\s(]*)")
PERCENTILES = re.compile(  # p50 and p99 as bench_queue and bench_start_latency pad them
    r"^\s*(?P<name>\S.*?)\s{2,}p50\s+(?P<p50>[\d.]+) ms, p99\s+(?P<p99>[\d.]+) ms")
SHARE = re.compile(r"\((?P<pct>\d+)% of (?P<base>[a-z ]+)")  # a same-run ratio, the steadier figure
LOWER_IS_BETTER = ("ms", "s", "MiB", "us", "µs", "calls", "kinstr")
TIMEOUT = 3600


def run_once(checkout: Path, bench: Path, sections: list[str]) -> dict[str, tuple[float, str]]:
    """The figures one run of ``bench`` against ``checkout``'s build printed:
    name -> (value, unit)."""
    python = checkout / ".venv" / "bin" / "python"
    done = subprocess.run([str(python), str(bench), *sections], cwd=checkout,
                          capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode not in (0, 1) or "Traceback (most recent call last)" in done.stderr:
        # (1 alone: a target missed, figures all the same)
        sys.exit(f"ab: {bench} in {checkout} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    figures = {}
    for line in done.stdout.splitlines():
        times = PERCENTILES.match(line)
        if times:
            for which in ("p50", "p99"):
                figures[f"{times['name']}: {which}"] = (float(times[which]), "ms")
            continue
        found = FIGURE.match(line)
        if found and not line.startswith("scratch "):
            name = found["name"].strip()
            figures[name] = (float(found["value"]), found["unit"])
            share = SHARE.search(line)
            if share:
                figures[f"{name}: % of {share['base'].strip()}"] = (float(share["pct"]), "%")
    return figures


def verdict(before: list[float], after: list[float], unit: str) -> str:
    """'worse' or 'better' only when the ranges do not overlap; else 'within spread'."""
    lower_better = unit in LOWER_IS_BETTER
    if max(after) < min(before):
        return "better" if lower_better else "WORSE"
    if min(after) > max(before):
        return "WORSE" if lower_better else "better"
    return "within spread"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bench", default="bench_queue.py")
    parser.add_argument("sections", nargs="*")
    args = parser.parse_args()
    bench = args.after.resolve() / "bench" / args.bench
    runs: dict[str, list[dict[str, tuple[float, str]]]] = {"before": [], "after": []}
    for round_no in range(args.rounds):
        for side in ("before", "after"):
            print(f"round {round_no + 1}/{args.rounds}: {side}", file=sys.stderr, flush=True)
            runs[side].append(run_once(getattr(args, side), bench, args.sections))
    print(f"{args.bench}, {args.rounds} alternating rounds: median [min-max]")
    print(f"{'figure':<56} {'before':>22} {'after':>22} {'ratio':>6}  verdict")
    worse = 0
    for name, (_value, unit) in runs["after"][0].items():
        before = [r[name][0] for r in runs["before"] if name in r]
        after = [r[name][0] for r in runs["after"] if name in r]
        if not before or len(after) < args.rounds:
            continue
        b, a = statistics.median(before), statistics.median(after)
        said = verdict(before, after, unit)
        worse += said == "WORSE"
        print(f"{name[:56]:<56} {_cell(b, before):>22} {_cell(a, after):>22} "
              f"{a / b if b else 0:6.2f}  {said} ({unit})")
    return 1 if worse else 0


def _cell(median: float, values: list[float]) -> str:
    return f"{median:.4g} [{min(values):.4g}-{max(values):.4g}]"


if __name__ == "__main__":
    sys.exit(main())
