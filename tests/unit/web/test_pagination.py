"""Paging arguments in process: ``offset`` and ``limit`` of the search, list,
done and audit routes checked before any daemon is asked (each 400 names
the field, its bound and what was given), and the defaults each sends."""

from __future__ import annotations

import pytest
import webfakes
from webfakes import FakeDaemons, Served


@pytest.fixture(scope="module")
def web(tmp_path_factory) -> Served:
    return webfakes.served(tmp_path_factory.mktemp("web"))


@pytest.fixture
def daemons(web) -> FakeDaemons:
    return web.daemons.reset()


@pytest.fixture
def client(web, daemons):
    return web.client


def refused(client, daemons, path: str) -> str:
    got = client.simulate_get(path)
    assert got.status_code == 400, got.text
    assert daemons.calls == []
    return got.json[1]


# ---------------------------------------------------------------- search.json (page_args)
def test_a_search_pages_25_from_the_first_by_default(client, daemons):
    got = client.simulate_get("/q/etl-1/search.json", params={"text": "db", "state": "err"})
    assert got.json == {"rows": [], "total": 0, "more": False, "partial": False}
    assert daemons.calls == [("etl-1", "search",
                              {"text": "db", "state": "err", "offset": 0, "limit": 25})]


@pytest.mark.parametrize(("query", "field", "most", "given"), [
    ("limit=0", "limit", 1000, "0"), ("limit=1001", "limit", 1000, "1001"),
    ("limit=ten", "limit", 1000, "ten"), ("limit=-5", "limit", 1000, "-5"),
    ("limit=2.5", "limit", 1000, "2.5"), ("offset=-1", "offset", 10**9, "-1"),
    ("offset=1000000001", "offset", 10**9, "1000000001"), ("offset=0x10", "offset", 10**9, "0x10"),
])
def test_a_search_page_out_of_bounds_is_400_naming_it(client, daemons, query, field, most,
                                                       given):
    assert refused(client, daemons, f"/q/etl-1/search.json?{query}") == \
        f"{field} must be an integer up to {most}, not {given!r}"


def test_a_search_takes_the_bounds_themselves(client, daemons):
    client.simulate_get("/q/etl-1/search.json?offset=1000000000&limit=1000")
    client.simulate_get("/q/etl-1/search.json?offset=0&limit=1")
    client.simulate_get("/q/etl-1/search.json?offset=&limit=")  # empty: the defaults
    assert [(a["offset"], a["limit"]) for _q, _op, a in daemons.calls] == [
        (10**9, 1000), (0, 1), (0, 25)]


def test_a_long_bad_value_is_cut_in_the_answer(client, daemons):
    assert refused(client, daemons, "/q/etl-1/search.json?limit=" + "9" * 100) == \
        f"limit must be an integer up to 1000, not {'9' * 40!r}"


# ---------------------------------------------------------------- messages.json, done.json
def test_a_list_pages_50_of_que_by_default_and_passes_the_tag(client, daemons):
    got = client.simulate_get("/q/etl-1/messages.json", params={"tag": "nightly"})
    assert got.json == {"ids": [webfakes.MID], "total": 1}
    assert daemons.calls == [("etl-1", "list", {"state": "que", "offset": 0, "limit": 50,
                                                "tag": "nightly"})]


@pytest.mark.parametrize(("query", "why"), [
    ("limit=1001", "limit must be an integer from 0 to 1000, not '1001'"),
    ("offset=-1", "offset must be an integer from 0 to 1000000000, not '-1'"),
    ("offset=x", "offset must be an integer from 0 to 1000000000, not 'x'"),
    ("state=gone", "state must be one of prep, que, run, done, err, relayed, not 'gone'"),
])
def test_a_list_out_of_bounds_is_400_naming_it(client, daemons, query, why):
    assert refused(client, daemons, f"/q/etl-1/messages.json?{query}") == why


@pytest.mark.parametrize(("query", "why"), [
    ("limit=1001", "limit must be between 0 and 1000"),
    ("limit=-1", "limit must be between 0 and 1000"),
    ("limit=many", "limit must be an integer, not 'many'"),
])
def test_the_done_list_is_bounded(client, daemons, query, why):
    assert refused(client, daemons, f"/q/etl-1/done.json?{query}") == why


def test_the_done_list_asks_for_ten_by_default(client, daemons):
    client.simulate_get("/q/etl-1/done.json")
    assert daemons.calls == [("etl-1", "list", {"state": "done", "limit": 10})]


# ---------------------------------------------------------------- audit.json
@pytest.mark.parametrize(("query", "why"), [
    ("limit=1001", "limit: at most 1000, not 1001"),
    ("offset=-3", "offset: not a whole number >= 0: '-3'"),
])
def test_the_audit_pages_are_bounded(client, daemons, query, why):
    assert refused(client, daemons, f"/audit.json?{query}") == why


def test_the_audit_pages_100_by_default(client):
    assert client.simulate_get("/audit.json").json == {
        "records": [], "total": 0, "offset": 0, "limit": 100}


# ---------------------------------------------------------------- a digit int() refuses
@pytest.mark.parametrize("path", ["/q/etl-1/search.json", "/q/etl-1/messages.json",
                                  "/audit.json"])
def test_a_superscript_digit_is_a_400_not_a_500(client, daemons, path):
    assert client.simulate_get(f"{path}?offset=\u00b2").status_code == 400
