"""A bad ``back`` (where a form post returns to) is refused before the action,
on a real daemon: it was checked after, so a 400 or a 500 answered a create,
a delete or an upload that had happened (a review found it)."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from conftest import web_client
from daemon_util import send

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def web(make_queue, daemon, layout):
    make_queue("q", 'echo "done" >&3\n')
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    client = web_client(layout)
    return proc, client


@pytest.mark.parametrize("back", ["http://evil.example/", "//evil.example", 5, ["/q/q"]])
def test_a_create_with_a_bad_back_creates_nothing(web, back):
    proc, client = web
    got = client.simulate_post("/q/q/new_message", json={"mesg": {"param1": "x"}, "back": back})
    assert got.status_code == 400 and b"back must be a path on this site" in got.content
    assert proc.call("counts")["counts"]["que"] == 0


def test_a_delete_with_a_bad_back_deletes_nothing(web):
    proc, client = web
    msg_id = send(proc)
    got = client.simulate_post(f"/q/q/{msg_id}", headers=FORM,
                               body=urlencode({"_method": "delete", "back": "//evil"}))
    assert got.status_code == 400
    assert proc.call("get", msg_id=msg_id)["state"] == "que"


def test_a_good_back_is_followed(web):
    proc, client = web
    got = client.simulate_post("/q/q/new_message", headers=FORM,
                               body=urlencode({"mesg": json.dumps({}), "back": "/q/q"}))
    assert got.status_code == 303 and got.headers["location"] == "/q/q"
    assert proc.call("counts")["counts"]["que"] == 1


def test_an_oper_that_is_not_a_word_is_refused(web):
    _proc, client = web
    got = client.simulate_post("/q/q/adminoper", json={"oper": ["up"]})
    assert got.status_code == 400 and b"name exactly one of" in got.content
