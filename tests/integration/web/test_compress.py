"""Pages and JSON gzip-compressed (issue 48 item 9) over real HTTP: a client
that accepts gzip gets the same bytes compressed, with its own ETag that a
later ``If-None-Match`` turns into a 304; one that does not (or refuses it
with ``q=0``) gets them plain; small answers and streams stay plain."""

from __future__ import annotations

import gzip

from web_support import web_server  # noqa: F401

from rqsys.web.compress import accepts_gzip


def test_a_client_that_takes_gzip_gets_it_and_its_etag_works(web_server):  # noqa: F811
    server = web_server()
    code, plain_h, plain = server.request("GET", "/openapi.json")
    assert code == 200 and plain_h.get("Content-Encoding") is None and len(plain) > 10000
    code, h, data = server.request("GET", "/openapi.json", headers={"Accept-Encoding": "gzip"})
    assert code == 200 and h["Content-Encoding"] == "gzip" and "Accept-Encoding" in h["Vary"]
    assert gzip.decompress(data) == plain and len(data) < len(plain) / 4
    assert h["ETag"] == plain_h["ETag"][:-1] + '-gzip"'
    code, h, data = server.request("GET", "/openapi.json", headers={
        "Accept-Encoding": "gzip", "If-None-Match": h["ETag"]})
    assert (code, data) == (304, b"")
    # a page too; refused gzip and a small answer stay plain
    code, h, data = server.request("GET", "/", headers={"Accept-Encoding": "gzip, br",
                                                         "Accept": "text/html"})
    assert code == 200 and h["Content-Encoding"] == "gzip"
    assert b"<html" in gzip.decompress(data)
    code, h, _d = server.request("GET", "/openapi.json",
                                 headers={"Accept-Encoding": "gzip;q=0, identity"})
    assert h.get("Content-Encoding") is None
    code, h, data = server.request("GET", "/q.json", headers={"Accept-Encoding": "gzip"})
    assert code == 200 and h.get("Content-Encoding") is None and data == b"[]"


def test_accept_encoding_is_read_as_http_says():
    assert accepts_gzip("gzip") and accepts_gzip("deflate, gzip;q=0.5") and accepts_gzip("*")
    assert not accepts_gzip(None) and not accepts_gzip("br") and not accepts_gzip("gzip;q=0")
    assert not accepts_gzip("gzip; q=0.0")  # spaces around params
    assert not accepts_gzip("GZIP;Q=0")
