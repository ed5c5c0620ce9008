"""The operator's console through a real daemon: how far along a running
message is, its timeline folded, and its live tail near the top of its page."""

from __future__ import annotations

import json
import time

from conftest import wait_for, web_client
from daemon_util import send, settle

PROGRESS_SCRIPT = """
for i in $(seq 1 300); do echo "run $i/300 rows" >&3; done
echo "output line" ; echo "run 45% merging" >&3
while [ ! -e "$RQ_MSG_DIR/../../../go" ]; do sleep 0.05; done
echo "done finished" >&3
"""


def test_a_running_message_shows_how_far_along_and_its_timeline_folded(layout, make_queue,
                                                                         daemon):
    # Given a script that reports 300 steps, then a percentage, and waits
    make_queue("q", PROGRESS_SCRIPT)
    proc = daemon("q")
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    client = web_client(layout)
    msg_id = send(proc)
    wait_for(lambda: proc.call("status", msg_id=msg_id)["status"] == "45% merging")
    # Then its JSON, tail and page say how far along it is
    shown = client.simulate_get(f"/q/q/{msg_id}.json").json
    assert shown["state"] == "run" and shown["progress"] == {"fraction": 0.45}
    tail = client.simulate_get(f"/q/q/{msg_id}/tail.json").json
    assert tail["progress"] == {"fraction": 0.45}
    page = client.simulate_get(f"/q/q/{msg_id}").text
    assert '<progress id="msg-progress" max="1" value="0.45"' in page
    run_tab = client.simulate_get("/q/q", params={"state": "run"}).text
    assert '<progress max="1" value="0.45" aria-label="progress 45%">' in run_tab
    # and its tail comes before its timeline, which folds the 301 status lines into one
    assert page.index('id="tail"') < page.index('id="timeline"')
    assert "301 status lines, last: " in page
    kinds = [e["ev"] for e in shown["_timeline"]]
    assert kinds == ["created", "started", "status"]
    assert shown["_timeline"][2]["folded"] == 301
    # and when it ends, the fold, the start and the end are all there
    (layout.queue_dir("q") / "go").write_text("")
    settle(proc, msg_id)
    done = client.simulate_get(f"/q/q/{msg_id}.json").json
    assert [e["ev"] for e in done["_timeline"]] == ["created", "started", "status", "exit",
                                                     "done"]
    assert done["progress"] is None
    assert done["_timeline"][2]["folded"] == 302 and done["_timeline"][2]["text"] == "finished"


def test_a_run_text_that_is_not_progress_has_none(layout, make_queue, daemon):
    make_queue("q", """
        echo "run 400% sure" >&3
        while [ ! -e "$RQ_MSG_DIR/../../../go" ]; do sleep 0.05; done
        echo done >&3
    """)
    proc = daemon("q")
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    msg_id = send(proc)
    wait_for(lambda: proc.call("status", msg_id=msg_id)["status"] == "400% sure")
    client = web_client(layout)
    assert client.simulate_get(f"/q/q/{msg_id}.json").json["progress"] is None
    assert "<progress" not in client.simulate_get(f"/q/q/{msg_id}").text
    (layout.queue_dir("q") / "go").write_text("")
    settle(proc, msg_id)


BROWSER = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
FORM = {**BROWSER, "Content-Type": "application/x-www-form-urlencoded"}


def test_errors_are_pages_of_the_console_for_a_browser_and_json_for_a_client(layout,
                                                                           make_queue, daemon):
    make_queue("q", 'echo "done" >&3\n')
    daemon("q")
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    client = web_client(layout)
    for path in ("/q/nosuch", "/q/q/20260101.0000.00.000.1", "/no/such/route"):
        page = client.simulate_get(path, headers=BROWSER)
        assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
        assert '<header class="top">' in page.text and 'id="error"' in page.text
    bad = client.simulate_get("/q/<script>", headers=BROWSER)
    assert bad.status_code in (400, 404) and "<script>" not in bad.text
    api = client.simulate_get("/q/nosuch.json")
    assert api.status_code == 404 and api.json == ["fail", "no queue named nosuch"]
    posted = client.simulate_post("/q/q/adminoper", body="oper=sideways", headers=FORM)
    assert posted.status_code == 400 and 'id="error"' in posted.text
    assert "name exactly one of up, down, pause, resume" in posted.text
    rq_client = client.simulate_post("/q/q/adminoper", body="oper=sideways",
                                     headers={"Content-Type": FORM["Content-Type"]})
    assert rq_client.json == ["fail", "name exactly one of up, down, pause, resume"]


def test_a_bad_field_is_shown_beside_it_with_what_was_typed_kept(layout, make_queue, daemon):
    make_queue("q", 'echo "done" >&3\n')
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    client = web_client(layout)
    form = client.simulate_get("/q/q/new_message").text
    assert 'type="datetime-local" id="mesg_due"' in form
    assert 'type="checkbox" id="mesg_force_remote"' in form
    assert 'type="number" id="mesg_priority"' in form
    # a due that is no time: the form again, 400, the error by the field, the input kept
    got = client.simulate_post("/q/q/new_message", headers=FORM,
                               body="x_format=html&mesg_param1=%3Ckept%3E&mesg_due=tomorrow")
    assert got.status_code == 400
    assert 'id="mesg_due-error">mesg_due must be a number' in got.text
    assert 'value="tomorrow"' in got.text and 'value="&lt;kept&gt;"' in got.text
    assert 'aria-invalid="true"' in got.text
    assert proc.call("counts")["counts"]["que"] == 0  # nothing was sent
    # a date and time from the form's picker is UTC
    sent = client.simulate_post("/q/q/new_message", headers=FORM,
                                body="x_format=html&mesg_param1=x&mesg_due=2030-01-02T03:04"
                                     "&mesg_force_remote=1")
    assert sent.status_code == 303
    msg_id = sent.headers["location"].rsplit("/", 1)[1]
    msg = client.simulate_get(f"/q/q/{msg_id}.json").json
    assert msg["due"] == 1893553440 and msg["force_remote"] is True
    # an API client still gets RQ's answer
    api = client.simulate_post("/q/q/new_message", body="mesg_due=tomorrow",
                               headers={"Content-Type": FORM["Content-Type"]})
    assert api.status_code == 400 and api.json[0] == "fail"


def test_an_unchanged_page_polled_again_costs_a_304_without_its_body(layout, make_queue,
                                                                      daemon):
    make_queue("q", 'echo "done" >&3\n')
    proc = daemon("q")
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    client = web_client(layout)
    for path in ("/", "/q/q", "/q.json"):
        first = client.simulate_get(path, headers=BROWSER)
        tag = first.headers["etag"]
        assert first.status_code == 200 and first.headers["cache-control"] == "no-cache"
        again = client.simulate_get(path, headers={**BROWSER, "If-None-Match": tag})
        assert again.status_code == 304 and again.content == b""
        stale = client.simulate_get(path, headers={**BROWSER, "If-None-Match": '"0000"'})
        assert stale.status_code == 200 and stale.text == first.text
    # a change changes the tag: the poll gets the new page
    before = client.simulate_get("/", headers=BROWSER).headers["etag"]
    settle(proc, send(proc))
    after = client.simulate_get("/", headers={**BROWSER, "If-None-Match": before})
    assert after.status_code == 200 and after.headers["etag"] != before


SEARCH_SCRIPT = """
case "$RQ_PARAM2" in
  bad) echo "err cannot reach $RQ_PARAM1" >&3 ;;
  *) echo "done reached $RQ_PARAM1" >&3 ;;
esac
"""


def test_search_finds_across_queues_and_states_and_tabs_count_the_matches(layout, make_queue,
                                                                            daemon):
    # Given db01 in two queues: in err and done in one, done in the other, and noise
    for name in ("a", "b"):
        make_queue(name, SEARCH_SCRIPT)
    a, b = daemon("a"), daemon("b")
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    client = web_client(layout)
    for proc, p1, p2 in ((a, "db01", "bad"), (a, "db01", "bad"), (a, "db01", "ok"),
                         (a, "web9", "bad"), (b, "db01", "ok"), (b, "web7", "bad")):
        settle(proc, send(proc, param1=p1, param2=p2))

    def searched():
        return client.simulate_get("/search.json", params={"q": "db01"}).json

    wait_for(lambda: searched()["queues"].get("b", {}).get("done") == 1)
    found = searched()
    assert found["queues"] == {"a": {"prep": 0, "que": 0, "run": 0, "done": 1, "err": 2,
                                     "relayed": 0},
                               "b": {"prep": 0, "que": 0, "run": 0, "done": 1, "err": 0,
                                     "relayed": 0}}
    assert len(found["rows"]) == 4 and {r["queue"] for r in found["rows"]} == {"a", "b"}
    assert found["errors"] == {}
    page = client.simulate_get("/search", params={"q": "db01"}, headers=BROWSER).text
    assert 'href="/q/a?state=err&amp;text=db01">2</a>' in page
    # and the queue page's tabs count what matches, from whichever tab
    queue = client.simulate_get("/q/a", params={"state": "done", "text": "db01"}).text
    assert "err (2)" in queue and "done (1)" in queue
    assert "err (3)" in client.simulate_get("/q/a", params={"state": "done"}).text  # all
    nothing = client.simulate_get("/search", params={"q": "nosuchword"}, headers=BROWSER)
    assert nothing.status_code == 200 and 'id="no-matches"' in nothing.text
    long = client.simulate_get("/search.json", params={"q": "x" * 501})
    assert long.status_code == 400 and long.json == ["fail", "q: at most 500 characters"]
    assert 'action="/search" role="search"' in page  # the header's box on every page


def test_chosen_rows_are_retried_deleted_or_moved_and_only_those(layout, make_queue, daemon):
    make_queue("a", SEARCH_SCRIPT)
    make_queue("b", SEARCH_SCRIPT)
    a = daemon("a")
    daemon("b").call("adminoper", oper="pause")
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    client = web_client(layout)
    errs = [send(a, param1=f"h{n}", param2="bad") for n in range(4)]
    dones = [send(a, param1=f"d{n}") for n in range(3)]
    for msg_id in errs + dones:
        settle(a, msg_id)
    def err_tab():
        return client.simulate_get("/q/a", params={"state": "err"}).text
    wait_for(lambda: all(f'value="{msg_id}" form="chosen"' in err_tab() for msg_id in errs))
    page = err_tab()
    assert '<option value="">choose a queue…</option>' in page  # no queue chosen for you

    def bulk(body):
        return client.simulate_post("/q/a/bulk", body=body, headers={
            "Content-Type": "application/x-www-form-urlencoded"})

    # delete two chosen done ones (and one named twice): only those go
    got = bulk(f"action=delete&state=done&id={dones[0]}&id={dones[1]}&id={dones[0]}")
    assert got.json == ["ok", {"action": "delete", "matched": 2, "count": 2,
                               "passed_over": 0}]
    assert a.call("counts")["counts"]["done"] == 1
    # move one chosen err to b, retry another; one in done is passed over by the retry
    assert bulk(f"action=move&state=err&dest=b&id={errs[0]}").json[1]["count"] == 1
    got = bulk(f"action=retry&state=err&id={errs[1]}&id={dones[2]}")
    assert got.json[1]["matched"] == 2 and got.json[1]["count"] == 1
    settle(a, errs[1])
    assert a.call("status", msg_id=errs[2])["state"] == "err"
    assert a.call("counts")["counts"]["err"] == 3  # errs 1 (failed again), 2 and 3
    # bad choices: a clear 400, nothing done
    for body, why in (("action=delete&state=err&id=../../etc", "invalid message id"),
                      ("action=retry&state=done&id=" + errs[2], "applies to err messages"),
                      ("action=delete&state=err&" + "&".join(
                          f"id=20260101.0000.00.000.{n}" for n in range(1001)),
                       "at most 1000 chosen messages")):
        refused = bulk(body)
        assert refused.status_code == 400 and why in refused.json[1], refused.json
    assert a.call("counts")["counts"]["err"] == 3


def test_trends_chart_each_range_and_a_retry_waits_from_its_retry(layout, make_queue, daemon):
    make_queue("q", """
        [ -e "$RQ_MSG_DIR/../../../fixed" ] && { echo "done fixed" >&3; exit 0; }
        echo "err not yet" >&3
    """)
    proc = daemon("q")
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    client = web_client(layout)
    msg_id = send(proc)
    settle(proc, msg_id)
    time.sleep(1.2)  # in err for a while: not a wait in the que
    (layout.queue_dir("q") / "fixed").write_text("")
    proc.call("retry", msg_id=msg_id)
    assert settle(proc, msg_id)["state"] == "done"
    waits = proc.call("stats")["windows"]["hour"]["wait"]
    assert waits["count"] == 2 and waits["p99"] <= 0.512  # not the 1.2 s it sat in err
    for shown, slots in (("1h", 60), ("24h", 24), ("7d", 168)):
        page = client.simulate_get("/q/q/trends", params={"range": shown})
        assert page.status_code == 200
        assert page.text.count('<svg class="chart"') == 3 and 'role="img"' in page.text
        assert f'href="/q/q/trends?range={shown}" class="on" aria-current="page"' in page.text
        got = proc.call("stats", span={"1h": "hour", "24h": "day", "7d": "week"}[shown])
        series = next(iter(got["series"].values()))
        assert len(series["done"]) == slots and sum(series["done"]) == 1
        assert sum(series["err"]) == 1 and len(series["wait_p99"]) == slots
    summary = client.simulate_get("/q/q/trends").text
    assert "done: latest 1, peak 1" in summary and "ms" in summary  # a range, not 0.001
    bad = client.simulate_get("/q/q/trends", params={"range": "3y"})
    assert bad.status_code == 400 and "range must be one of 1h, 24h, 7d" in bad.json[1]
    assert client.simulate_get("/q/nosuch/trends").status_code == 404


def test_the_form_sends_a_message_with_a_file_through_prep(layout, make_queue, daemon):
    make_queue("q", 'echo "done read $(cat "$RQ_MSG_DIR/../attach/rows.csv")" >&3\n')
    proc = daemon("q")
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    client = web_client(layout)
    assert 'name="_method" value="prep"' in client.simulate_get("/q/q/new_message").text
    sent = client.simulate_post("/q/q/new_message", headers=FORM,
                                body="x_format=html&mesg_param1=x&_method=prep")
    assert sent.status_code == 303
    page_path = sent.headers["location"]
    msg_id = page_path.rsplit("/", 1)[1]
    assert proc.call("state", msg_id=msg_id)["state"] == "prep"
    page = client.simulate_get(page_path, headers=BROWSER).text
    action = f"/q/q/{msg_id}/attach/new?back=%2Fq%2Fq%2F{msg_id}"
    assert f'enctype="multipart/form-data" action="{action}"' in page.replace("&amp;", "&")
    boundary = "b0undary"
    upload = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"filedata\"; "
              f"filename=\"rows.csv\"\r\nContent-Type: text/csv\r\n\r\na,b\r\n"
              f"--{boundary}--\r\n")
    path, query = action.split("?")
    attached = client.simulate_post(path, query_string=query, body=upload, headers={
        **BROWSER, "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert attached.status_code == 303 and attached.headers["location"] == page_path
    assert "rows.csv" in client.simulate_get(page_path).text
    client.simulate_post(page_path, headers=FORM, body=f"_method=commit&back={page_path}")
    assert settle(proc, msg_id)["status"] == "read a,b"


ATTEMPTS = """
n=$(( $(cat "$RQ_MSG_DIR/../../../n" 2>/dev/null || echo 0) + 1 ))
echo $n > "$RQ_MSG_DIR/../../../n"
echo "reading rows"
echo "attempt $n failed: KeyError row$n"
exit 3
"""


def test_every_attempt_is_kept_with_its_own_last_lines(layout, make_queue, daemon):
    # Given a script that fails each run its own way, and a queue that retries it twice
    make_queue("q", ATTEMPTS, retry={"max": 2, "backoff": "fixed", "base": 0})
    proc = daemon("q")
    client = web_client(layout)
    msg_id = send(proc)
    settle(proc, msg_id)
    # Then its JSON keeps each attempt's end and last lines, not only the last one's
    shown = client.simulate_get(f"/q/q/{msg_id}.json").json
    ends = [e for e in shown["_timeline"] if e["ev"] in ("retry", "err")]
    assert [e["ev"] for e in ends] == ["retry", "retry", "err"]
    assert [e["last_lines"] for e in ends] == [
        ["reading rows", f"attempt {n} failed: KeyError row{n}"] for n in (1, 2, 3)]
    # and its page lists the three runs, each with what became of it and its own lines
    page = client.simulate_get(f"/q/q/{msg_id}").text
    for n in (1, 2, 3):
        row = page[page.index(f'<tr id="run-{n}">'):]
        row = row[:row.index("</tr>")]
        assert "exit 3" in row
        assert f"attempt {n} failed: KeyError row{n}" in row
        assert ("retry: " if n < 3 else "err: ") in row
    assert "attempt 4" not in page
