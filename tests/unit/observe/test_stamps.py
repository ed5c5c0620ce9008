"""The time to the ms and its text, made once a millisecond (rqsys.observe.stamps)."""

from __future__ import annotations

import time

from rqsys.observe import stamps, stats


def test_now_is_the_rounded_time_and_its_repr():
    before = time.time()
    at, text = stamps.now()
    after = time.time()
    assert round(before, 3) - 0.001 <= at <= round(after, 3) + 0.001
    assert text == repr(at) and at == round(at, 3)
    assert stamps.text(at) == text
    assert stamps.text(0.25) == "0.25" and stamps.text(float("nan")) == "nan"


def test_id_time_from_the_seconds_cache_matches_the_parse():
    ids = ["20261124.0647.22.826.0", "20261124.0647.22.827.3", "20261124.0647.22.12",
           "20261124.0647.22.1x", "20261399.0647.22.826.0", "x"]
    first = [stats.id_time(i) for i in ids]
    assert [stats.id_time(i) for i in ids] == first == [stats._id_time(i) for i in ids]
    assert first[0] == 1795502842.826 and first[3:] == [0.0, 0.0, 0.0]
