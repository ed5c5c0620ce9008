"""Unit tests of a timeline as shown: status lines folded, the landmarks never left out."""

from __future__ import annotations

from rqsys.observe.timeline import FOLD_KEEPS, shown


def _ev(kind, t, text=""):
    return {"t": t, "ev": kind, **({"text": text} if text else {})}


def test_consecutive_status_lines_fold_into_their_last():
    events = [_ev("created", 0), _ev("started", 1),
              *[_ev("status", 2 + n, f"{n}/137") for n in range(137)],
              _ev("exit", 200), _ev("done", 201, "ok")]
    got = shown(events, 200)
    assert [e["ev"] for e in got] == ["created", "started", "status", "exit", "done"]
    fold = got[2]
    assert fold["folded"] == 137 and fold["text"] == "136/137" and fold["t"] == 138
    assert [e["text"] for e in fold["earlier"]] == [f"{n}/137" for n in range(116, 136)]
    assert len(fold["earlier"]) == FOLD_KEEPS
    assert "folded" not in events[2]  # the events read are not changed


def test_status_lines_apart_are_folded_apart_and_one_alone_is_not_marked():
    events = [_ev("status", 1, "a"), _ev("status", 2, "b"), _ev("timeout", 3),
              _ev("status", 4, "c")]
    got = shown(events, 200)
    assert [(e["ev"], e.get("folded")) for e in got] == [("status", 2), ("timeout", None),
                                                          ("status", None)]


def test_over_the_limit_the_oldest_others_go_never_a_landmark():
    events = [_ev("created", 0)]
    for run in range(150):  # each run: started, a resend between two status lines... ends
        events += [_ev("started", 10 * run + 1), _ev("status", 10 * run + 2, "x"),
                   _ev("exit", 10 * run + 3), _ev("resend", 10 * run + 4)]
    events.append(_ev("err", 9999, "gave up"))
    got = shown(events, 200)
    kinds = [e["ev"] for e in got]
    assert kinds.count("started") == 150 and kinds.count("exit") == 150
    assert kinds[0] == "created" and kinds[-1] == "err"
    assert len(got) == 302  # the landmarks alone are more than the limit: all kept
    assert shown(events[:41], 30)[-1] == events[40]  # the newest others kept


def test_reading_folded_is_folding_what_was_read(tmp_path):
    import json

    from rqsys.observe import timeline

    events = [_ev("created", 0), _ev("started", 1),
              *[_ev("status", 2 + n, f"{n}/500") for n in range(500)],
              _ev("timeout", 600), _ev("status", 601, "alone"), _ev("exit", 602),
              *[_ev("status", 700 + n, f"again {n}") for n in range(3)], _ev("err", 800, "x")]
    lines = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events)
    (tmp_path / timeline.FILE).write_text(lines + '{"t":900,"ev":"sta')  # a torn last line
    folded = timeline.read_folded(tmp_path)
    assert folded == shown(timeline.read(tmp_path), 10_000)
    assert [e["ev"] for e in folded] == ["created", "started", "status", "timeout", "status",
                                         "exit", "status", "err"]
    assert folded[2]["folded"] == 500 and "folded" not in folded[4]
    assert timeline.times(folded) == timeline.times(timeline.read(tmp_path))


def test_a_torn_status_line_is_not_counted_and_landmarks_are_bounded(tmp_path):
    import json

    from rqsys.observe import timeline

    events = [_ev("created", 0), *[_ev("status", 1 + n, f"{n}") for n in range(3)]]
    lines = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events)
    (tmp_path / timeline.FILE).write_text(lines + '{"t":9,"ev":"status","text":"4')
    folded = timeline.read_folded(tmp_path)
    assert folded == shown(timeline.read(tmp_path), 200) and folded[1]["folded"] == 3
    many = [_ev("created", 0)] + [_ev("started" if n % 2 else "exit", n) for n in range(1, 3000)]
    got = shown(many, 200)
    assert len(got) == timeline.LANDMARKS_SHOWN and got[0]["ev"] == "created"
    assert got[-1] == many[-1]
