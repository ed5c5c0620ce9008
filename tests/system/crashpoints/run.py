"""Crash points in full: every (phase, syscall, N), or --points N of them spread evenly.

Prints ``crashpoints: N points, A acked, L lost, C corrupted`` (N counts the
points the workload reached) and exits non-zero on any loss or corruption.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cp_points  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--points", type=int, default=0, help="how many (default: all)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--budget", type=float, default=0, help="seconds after which no "
                        "further point is started (default: none); the phases are "
                        "interleaved, so a run cut short still covers each of them")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        calibration = {phase: cp_points.calibrate(phase) for phase in cp_points.PHASES}
        sizes = {p: {s: len(ns) for s, ns in c.items()} for p, c in calibration.items()}
        print(f"calibration (write-side calls per syscall): {sizes}", flush=True)
        points = cp_points.all_points(calibration)
        chosen = interleave(cp_points.spread(points, args.points or len(points)))
        stop_at = started + args.budget if args.budget else float("inf")
        results = run_all(chosen, args.jobs, args.verbose, stop_at)
    finally:
        cp_points.close_far_end()
    return report(results, len(points), time.monotonic() - started)


def interleave(points: list[cp_points.Point]) -> list[cp_points.Point]:
    """The points in an order that takes each phase at its own pace (any prefix
    holds about the same share of every phase)."""
    by_phase: dict[str, list[cp_points.Point]] = {}
    for point in points:
        by_phase.setdefault(point[0], []).append(point)
    ranked = [((k + 0.5) / len(ps), point) for ps in by_phase.values()
              for k, point in enumerate(ps)]
    return [point for _, point in sorted(ranked)]


def run_all(points: list[cp_points.Point], jobs: int, verbose: bool,
            stop_at: float = float("inf")) -> list[cp_points.Result]:
    """Every point (those not started by ``stop_at`` are left out), results as they end."""
    def one(point: cp_points.Point) -> cp_points.Result | None:
        return None if time.monotonic() > stop_at else cp_points.run_point(point)

    results: list[cp_points.Result] = []
    with ThreadPoolExecutor(jobs) as pool:
        for future in as_completed([pool.submit(one, point) for point in points]):
            result = future.result()
            if result is None:
                continue
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


def _phases(results: list[cp_points.Result]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for result in results:
        counts[result.point[0]] = counts.get(result.point[0], 0) + 1
    return counts


def report(results: list[cp_points.Result], total: int, seconds: float) -> int:
    reached = [r for r in results if r.reached]
    print(f"({len(results)} of {total} points tried, {len(results) - len(reached)} not reached, "
          f"{seconds:.0f}s; by phase: {_phases(reached)})")
    print(f"crashpoints: {len(reached)} points, {_tally(results).split(' reached, ')[1]}")
    return 1 if any(r.lost or r.corrupted for r in reached) else 0


if __name__ == "__main__":
    sys.exit(main())
