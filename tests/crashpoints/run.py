"""Crash points in full: every (phase, syscall, N), or --points N of them spread evenly.

Prints ``crashpoints: N points, A acked, L lost, C corrupted`` (N counts the
points the workload reached) and exits non-zero on any loss or corruption.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cp_points  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--points", type=int, default=0, help="how many (default: all)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        calibration = {phase: cp_points.calibrate(phase) for phase in cp_points.PHASES}
        sizes = {p: {s: len(ns) for s, ns in c.items()} for p, c in calibration.items()}
        print(f"calibration (write-side calls per syscall): {sizes}", flush=True)
        points = cp_points.all_points(calibration)
        chosen = cp_points.spread(points, args.points or len(points))
        results = run_all(chosen, args.jobs, args.verbose)
    finally:
        cp_points.close_far_end()
    return report(results, len(points), time.monotonic() - started)


def run_all(points: list[cp_points.Point], jobs: int, verbose: bool) -> list[cp_points.Result]:
    results: list[cp_points.Result] = []
    with ThreadPoolExecutor(jobs) as pool:
        for result in pool.map(cp_points.run_point, points):
            results.append(result)
            if len(results) % 50 == 0:
                print(f"  ... {len(results)} of {len(points)}: {_tally(results)}", flush=True)
            if verbose or result.lost or result.corrupted:
                print(f"  {result.point}: reached={result.reached} acked={result.acked} "
                      f"lost={result.lost} corrupted={result.corrupted}", flush=True)
    return results


def _tally(results: list[cp_points.Result]) -> str:
    reached = [r for r in results if r.reached]
    return (f"{len(reached)} reached, {sum(r.acked for r in reached)} acked, "
            f"{sum(len(r.lost) for r in reached)} lost, "
            f"{sum(len(r.corrupted) for r in reached)} corrupted")


def report(results: list[cp_points.Result], total: int, seconds: float) -> int:
    reached = [r for r in results if r.reached]
    print(f"({len(results)} of {total} points tried, {len(results) - len(reached)} not reached, "
          f"{seconds:.0f}s)")
    print(f"crashpoints: {len(reached)} points, {_tally(results).split(' reached, ')[1]}")
    return 1 if any(r.lost or r.corrupted for r in reached) else 0


if __name__ == "__main__":
    sys.exit(main())
