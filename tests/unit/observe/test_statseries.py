"""The dashboard's series (last hour by minute, last day by hour) from a
queue's stats slots, and the SVG sparkline drawn from them."""

from __future__ import annotations

from rqsys.observe.stats import QueueStats
from rqsys.observe.statseries import series
from rqsys.web.sparkline import sparkline

T0 = 1_795_000_000 // 3600 * 3600.0  # a whole hour (UTC)


def _stats_with_ends() -> QueueStats:
    clock = [T0]
    stats = QueueStats(clock=lambda: clock[0])
    for minute, ends in ((0, 2), (5, 3)):
        clock[0] = T0 + minute * 60 + 1
        for _ in range(ends):
            stats("done", "", "m", {})
        stats("err", "", "m", {})
        stats("started", "", "20261124.0000.00.000.0", {"RQ_RUN": 1})
    return stats


def test_series_counts_ends_per_minute_and_hour():
    stats = _stats_with_ends()
    got = series(stats, now=T0 + 5 * 60 + 30)
    hour, day = got["hour"], got["day"]
    assert (hour["step"], len(hour["ended"])) == (60, 60)
    assert hour["ended"][-6:] == [3, 0, 0, 0, 0, 4]  # minute 0: 2 done + 1 err; minute 5: 3 + 1
    assert hour["err"][-6:] == [1, 0, 0, 0, 0, 1] and sum(hour["ended"]) == 7
    assert hour["wait_p50"][-1] is not None and hour["wait_p50"][-2] is None
    assert (day["step"], len(day["ended"]), day["ended"][-1], sum(day["ended"][:-1])) == (
        3600, 24, 7, 0)


def test_sparkline_scales_to_the_peak_and_escapes_its_title():
    from rqsys.web.html import templates

    spark = sparkline([0, 2, None, 4], 'ended <per> "minute"')
    svg = templates().get_template("macros.html").module.spark(spark)
    assert svg.count("<polyline") == 1 and "&lt;per&gt;" in svg and "<per>" not in svg
    points = svg.split('class="line" points="')[1].split('"')[0].split()
    ys = [float(p.split(",")[1]) for p in points]
    # the peak on top, 0 and gaps at the floor
    assert ys[3] == min(ys) and ys[0] == ys[2] == max(ys)
