"""The daemon's copies of its store (message timelines, the search index) on a
real daemon whose writes to them fail: the messages are unharmed, ``stats``
counts the failures, the log tells them once, and the index mends itself."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import wait_for
from daemon_util import failing_calls, send, settle, store_of
from test_metrics import _client, _scrape

from rqsys.search import index as searchindex


def test_a_timeline_that_cannot_be_written_is_counted_and_told(layout, make_queue, daemon):
    # Given a queued message whose timeline (none yet: its creation is no
    # line) is a directory
    make_queue("q", 'echo "done fine" >&3\n')
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    msg_id = send(proc)
    path = store_of(layout, "q").msg_dir("que", msg_id) / "timeline"
    path.mkdir()
    # When it runs
    proc.call("adminoper", oper="up")
    got = settle(proc, msg_id)
    # Then it ends as its script said, and stats and the log tell the lines lost
    assert (got["state"], got["status"]) == ("done", "fine")
    stats = wait_for(lambda: (s := proc.call("stats"))["timelines"]["failed"] >= 2 and s,
                     10, "the started and ended lines counted")
    assert "Is a directory" in stats["timelines"]["error"], stats["timelines"]
    assert stats["index"] == {"failed": 0, "error": "", "behind": False}
    wait_for(lambda: "lines not written since the start" in proc.stderr_text(), 10, "the log")
    scraped = _scrape(_client(layout))
    assert scraped[("rqsys_queue_copy_write_failures_total", (("copy", "timelines"),
                                                                ("queue", "q")))] >= 2
    told = [line for line in proc.stderr_text().splitlines() if "timelines:" in line]
    assert 1 <= len(told) <= proc.call("stats")["timelines"]["failed"], told  # once a count
    assert "the messages are unharmed" in told[0], told


def test_a_search_index_that_cannot_write_is_behind_then_mended(layout, make_queue, daemon):
    # Given a queue whose index has a first message
    make_queue("q", 'echo "done fine $RQ_PARAM1" >&3\n')
    proc = daemon("q")
    settle(proc, send(proc, param1="before"))
    wait_for(lambda: _found(proc, "before"), 10, "the first message indexed")
    # When every write of the index's thread fails with EIO (strace's fault injection)
    with failing_calls(proc.proc.pid, "pwrite64,write", "error=EIO",
                       tid=_thread(proc.proc.pid, "rq-search")):
        during = send(proc, param1="during")
        assert settle(proc, during)["state"] == "done"
        # Then the message is done, the index is behind, and searches say partial
        stats = wait_for(lambda: (s := proc.call("stats"))["index"]["failed"] and s, 10,
                         "the failed batch counted")
        assert stats["index"]["behind"] is True and "I/O" in stats["index"]["error"], stats
        assert proc.call("search", text="during")["partial"] is True
        wait_for(lambda: "searches answer partial" in proc.stderr_text(), 10, "the log")
    # And once the disk writes again the thread mends it (HEAL_WAIT) and finds the message
    wait_for(lambda: _found(proc, "during"), searchindex.HEAL_WAIT + 10, "the index mended")
    assert proc.call("stats")["index"]["behind"] is False
    wait_for(lambda: "search index mended" in proc.stderr_text(), 10, "the log")
    assert _found(proc, "before")


def _found(proc, word: str) -> bool:
    got = proc.call("search", text=word)
    return got["total"] == 1 and not got["partial"]


def _thread(pid: int, name: str) -> str:
    def find() -> str | None:
        for tid in os.listdir(f"/proc/{pid}/task"):
            if Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() == name:
                return tid
        return None
    return wait_for(find, 10, f"the {name} thread")

