"""The console's charts (issue 48 item 8): a value alone between gaps is a dot,
not an invisible one-point line; the dashboard's *Ended / min* counts the 60 s
before now, so it does not read 0 just after a minute began."""

from __future__ import annotations

from rqsys.web import charts
from rqsys.web.dashboard import last_minute


def test_a_value_alone_is_a_dot_and_a_run_a_line():
    got = charts.chart("c", "ended", 0.0, 60, [("ended", [None, 5, None, 3, 4, None])])
    (line,) = got["lines"]
    assert len(line["dots"]) == 1 and len(line["runs"]) == 1
    x, y = (float(v) for v in line["dots"][0])
    assert 0 < x < got["width"] and 0 < y < got["height"]
    assert len(line["runs"][0].split()) == 2  # the 3 and the 4


def test_one_point_only_after_2050_messages_shows():
    got = charts.chart("w", "wait", 0.0, 60, [("p50", [None] * 59 + [0.25])], latency=True)
    assert got["lines"][0]["dots"] and not got["lines"][0]["runs"]


def test_ended_per_minute_counts_the_60_s_before_now():
    hour = {"start": 0, "step": 60, "ended": [0] * 58 + [2050, 0]}
    assert last_minute(hour, 59 * 60 + 1) == 2016  # 1 s into the new minute: 59/60 of it
    assert last_minute(hour, 59 * 60 + 59) == 34
    assert last_minute({"start": 0, "step": 60, "ended": []}, 0) == 0
    assert last_minute({"start": 0, "step": 60, "ended": [0] * 59 + [7]}, 59 * 60 + 30) == 7
