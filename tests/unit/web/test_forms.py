"""Form and body handling in process, on a fake of the daemons: the message
``new_message`` makes of each of its three forms (``mesg`` JSON, RQ's
``mesg[field]``, our ``mesg_*``) and of a JSON body, ``_method`` wherever it
is given, ``back``, and the 400s that name what was wrong; the message
routes' ``_method`` and ``adminoper``'s one operation."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
import webfakes
from webfakes import HOST, MID, FakeDaemons, Served

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
JSON = {"Content-Type": "application/json"}
BY = "http 127.0.0.1"
URL = f"http://{HOST}:3333/q/etl-1/{MID}"


@pytest.fixture(scope="module")
def web(tmp_path_factory) -> Served:
    return webfakes.served(tmp_path_factory.mktemp("web"))


@pytest.fixture
def daemons(web) -> FakeDaemons:
    return web.daemons.reset()


@pytest.fixture
def client(web, daemons):
    return web.client


def post_form(client, path: str, fields, headers=None):
    return client.simulate_post(path, body=urlencode(fields), headers={**FORM, **(headers or {})})


def created(daemons: FakeDaemons) -> dict:
    """The one create the web asked for, without its actor and by."""
    [(queue, op, args)] = daemons.calls
    assert (queue, op, args.pop("by")) == ("etl-1", "create", BY)
    assert args.pop("actor")["role"] == "admin"
    return args


# ---------------------------------------------------------------- the three forms
def test_mesg_json_text_is_the_message_and_the_answer_is_its_url(client, daemons):
    got = post_form(client, "/q/etl-1/new_message", {"mesg": '{"param1": "a", "due": 5}'})
    assert got.json == ["ok", URL]
    assert created(daemons) == {"msg": {"param1": "a", "due": 5}}


def test_rqs_nested_form_keeps_its_fields_drops_the_unknown_and_empty(client, daemons):
    fields = [("mesg[param1]", "a"), ("mesg[param2]", ""), ("mesg[bogus]", "x"),
              ("mesg[dest]", "etl-1"), ("mesg[_method]", "single_que")]
    assert post_form(client, "/q/etl-1/new_message", fields).json == ["ok", URL]
    assert created(daemons) == {"msg": {"param1": "a", "dest": "etl-1"}, "single": True}


def test_our_mesg_fields_are_typed(client, daemons):
    fields = {"mesg_param1": "a", "mesg_max_count": "3", "mesg_due": "2026-11-28T10:30",
              "mesg_tags": "red, blue green", "mesg_force_remote": "on", "mesg_src": "",
              "mesg_timeout": "1.5"}
    assert post_form(client, "/q/etl-1/new_message", fields).status_code == 200
    assert created(daemons) == {"msg": {"param1": "a", "max_count": 3, "due": 1795861800.0,
                                        "tags": ["red", "blue", "green"],
                                        "force_remote": True, "timeout": 1.5}}


def test_a_json_body_is_the_message_or_holds_it_as_mesg(client, daemons):
    client.simulate_post("/q/etl-1/new_message", body='{"param1": "a"}', headers=JSON)
    client.simulate_post("/q/etl-1/new_message", headers=JSON,
                         body='{"mesg": {"param1": "b", "_method": "prep"}}')
    assert [(args["msg"], args.get("state")) for _q, _op, args in daemons.calls] == [
        ({"param1": "a"}, None), ({"param1": "b"}, "prep")]


@pytest.mark.parametrize(("outer", "inner", "method_args"), [
    (None, None, {}), ("prep", None, {"state": "prep"}), (None, "single_que", {"single": True}),
    ("prep", "commit", {}),  # RQ's inside mesg wins over ours beside it
])
def test_method_beside_or_inside_mesg_says_how_it_is_created(client, daemons, outer, inner,
                                                             method_args):
    msg = {"param1": "a", **({"_method": inner} if inner else {})}
    fields = {"mesg": json.dumps(msg), **({"_method": outer} if outer else {})}
    assert post_form(client, "/q/etl-1/new_message", fields).status_code == 200
    assert created(daemons) == {"msg": {"param1": "a"}, **method_args}


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize(("fields", "why"), [
    ({"mesg": "{"}, "mesg is not valid JSON: Expecting property name enclosed in double "
                    "quotes: line 1 column 2 (char 1)"),
    ({"mesg": "[1]"}, "mesg must be a JSON object"),
    ({"mesg": '{"due": NaN}'}, "mesg is not valid JSON: NaN is not a JSON number"),
    ({"mesg": "{}", "_method": "later"}, "_method must be commit, prep or single_que, "
                                         "not 'later'"),
    ({"mesg": '{"_method": "later"}'}, "_method must be commit, prep or single_que, "
                                       "not 'later'"),
    ({"mesg_max_count": "lots"}, "mesg_max_count must be a number, not 'lots'"),
    ({"mesg_due": "inf"}, "mesg_due must be a number, not 'inf'"),
    ({"mesg_due": "2026-13-01T10:00"}, "mesg_due must be a date and time (2026-11-28T10:30) "
                                       "or a number, not '2026-13-01T10:00'"),
    ({"mesg_src": ""}, "no message: send mesg=<JSON>, mesg[field] or mesg_* form fields"),
    ({"mesg": "{}", "back": "http://evil.example/"},
     "back must be a path on this site: 'http://evil.example/'"),
])
def test_a_bad_form_is_400_naming_what_and_no_daemon_is_asked(client, daemons, fields, why):
    got = post_form(client, "/q/etl-1/new_message", fields)
    assert (got.status_code, got.json) == (400, ["fail", why])
    assert daemons.calls == []


@pytest.mark.parametrize(("body", "ctype", "why"), [
    ("[1, 2]", "application/json", "a JSON body must be an object"),
    ("{", "application/json", "request body is not valid JSON: Expecting property name "
                              "enclosed in double quotes: line 1 column 2 (char 1)"),
    ("x", "text/plain", "unsupported content type 'text/plain' (use a form, a multipart "
                        "form or application/json)"),
])
def test_a_bad_body_is_400_naming_what(client, daemons, body, ctype, why):
    got = client.simulate_post("/q/etl-1/new_message", body=body, headers={"Content-Type": ctype})
    assert (got.status_code, got.json) == (400, ["fail", why])
    assert daemons.calls == []


def test_the_html_form_comes_back_with_its_error_and_what_was_typed(client, daemons):
    got = post_form(client, "/q/etl-1/new_message",
                    {"mesg_max_count": "lots", "mesg_param1": "kept-text", "x_format": "html"})
    assert got.status_code == 400
    assert got.headers["Content-Type"].startswith("text/html")
    assert "mesg_max_count must be a number, not &#39;lots&#39;" in got.text
    assert 'value="kept-text"' in got.text
    assert daemons.calls == []


# ---------------------------------------------------------------- answers
def test_back_is_answered_303_and_an_html_form_goes_to_the_message(client):
    got = post_form(client, "/q/etl-1/new_message", {"mesg": "{}", "back": "/q/etl-1?x=1"})
    assert (got.status_code, got.headers["Location"]) == (303, "/q/etl-1?x=1")
    got = post_form(client, "/q/etl-1/new_message", {"mesg": "{}", "x_format": "html"})
    assert (got.status_code, got.headers["Location"]) == (303, f"/q/etl-1/{MID}")


def test_a_held_unique_key_is_said_in_a_header_and_the_answer_stays_rqs(client, daemons):
    daemons.answers["create"] = {"msg_id": MID, "duplicate": True}
    got = post_form(client, "/q/etl-1/new_message", {"mesg": '{"unique_key": "k"}'})
    assert got.json == ["ok", URL] and got.headers["RQ-Duplicate"] == "true"


def test_a_w3c_traceparent_header_goes_into_the_message_and_a_bad_one_does_not(client, daemons):
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    post_form(client, "/q/etl-1/new_message", {"mesg": "{}"}, {"traceparent": parent})
    post_form(client, "/q/etl-1/new_message", {"mesg": "{}"}, {"traceparent": "00-zz"})
    assert [args["msg"] for _q, _op, args in daemons.calls] == [{"traceparent": parent}, {}]


# ---------------------------------------------------------------- a message's _method
@pytest.mark.parametrize(("method", "op", "extra", "value"), [
    ("delete", "delete", {}, "delete: done"),
    ("commit", "commit", {}, URL),
    ("cancel", "cancel", {"by": "http 127.0.0.1"}, "cancel: done"),
])
def test_a_messages_method_is_its_daemon_op(client, daemons, method, op, extra, value):
    got = post_form(client, f"/q/etl-1/{MID}", {"_method": method})
    assert got.json == ["ok", value]
    [(queue, asked, args)] = daemons.calls
    assert (queue, asked) == ("etl-1", op)
    assert {k: v for k, v in args.items() if k != "actor"} == {"msg_id": MID, **extra}


@pytest.mark.parametrize("fields", [{}, {"_method": "run_now"}, {"_method": "DELETE"}])
def test_a_messages_method_must_be_one_it_knows(client, daemons, fields):
    got = post_form(client, f"/q/etl-1/{MID}", fields)
    assert got.json == ["fail", "_method must be one of delete, destroy, commit, retry, cancel"]
    assert got.status_code == 400 and daemons.calls == []


def test_a_bad_message_id_is_400_before_any_daemon(client, daemons):
    got = post_form(client, "/q/etl-1/2026", {"_method": "delete"})
    assert (got.status_code, got.json) == (400, ["fail", "invalid message id: '2026'"])
    assert daemons.calls == []


@pytest.mark.parametrize(("fields", "oper"), [
    ({"pause": "1"}, "pause"), ({"oper": "down"}, "down"), ({"up": "", "oper": "up"}, "up")])
def test_adminoper_takes_one_operation_by_field_or_oper(client, daemons, fields, oper):
    assert post_form(client, "/q/etl-1/adminoper", fields).json == ["ok", "PAUSE"]
    assert daemons.calls[0][2]["oper"] == oper


@pytest.mark.parametrize("fields", [{}, {"pause": "1", "down": "1"}, {"oper": "restart"},
                                    {"pause": "1", "oper": "up"}])
def test_adminoper_refuses_none_or_two(client, daemons, fields):
    got = post_form(client, "/q/etl-1/adminoper", fields)
    assert (got.status_code, got.json) == (400, ["fail", "name exactly one of up, down, "
                                                         "pause, resume"])
    assert daemons.calls == []
