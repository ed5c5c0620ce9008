"""Trigger files, params and secrets (rqsys.triggers.spec, .params, .secrets, .webhook)."""

from __future__ import annotations

import json
import os

import pytest

from rqsys.errors import ConfigError, NotFound
from rqsys.triggers import params, secrets, spec, webhook
from rqsys.triggers.secrets import SecretUnreadable

HOOK = {"webhook": {"secret": {"file": "/etc/s"}, "signature": "github"},
        "msg": {"dest": "inbox"}}


def test_a_webhook_trigger_with_its_defaults():
    found = spec.parse("gh", HOOK, "gh.json")
    assert (found.kind, found.dest) == ("webhook", "inbox")
    assert found.settings["max_body"] == 1 << 20 and found.settings["tolerance"] == 300


@pytest.mark.parametrize("data, field", [
    ({"msg": {"dest": "q"}}, "give exactly one (given: none)"),
    ({**HOOK, "files": {"path": "/x"}}, "given: files and webhook"),
    ({"webhook": HOOK["webhook"], "msg": {}}, "dest"),
    ({**HOOK, "msg": {"dest": "q", "unique_key": "k"}}, "msg"),
    ({**HOOK, "params": {"param5": "$.a"}}, "params"),
    ({**HOOK, "params": {"param1": "body.a"}}, "params/param1"),
    ({"webhook": {**HOOK["webhook"], "signature": "md5"}, "msg": {"dest": "q"}}, "signature"),
    ({"webhook": {**HOOK["webhook"], "secret": "plain"}, "msg": {"dest": "q"}}, "secret"),
    ({**HOOK, "colour": "red"}, "colour"),
    ([], "(top level)"),
])
def test_a_bad_trigger_is_refused_naming_why(data, field):
    with pytest.raises(ConfigError, match=r"t\.json: .*"):
        try:
            spec.parse("t", data, "t.json")
        except ConfigError as exc:
            assert field in str(exc), str(exc)
            raise


def test_the_other_kinds_shapes_are_in_the_schema():
    spec.parse("f", {"files": {"path": "/srv/in", "glob": "*.csv"}, "msg": {"dest": "q"}},
               "f.json")
    spec.parse("j", {"journal": {"match": {"_SYSTEMD_UNIT": "x.service"}},
                     "msg": {"dest": "q"}, "rate_limit": {"limit": 5, "per": 60}}, "j.json")


def test_names_and_files(layout):
    tdir = spec.triggers_dir(layout)
    tdir.mkdir()
    for name in ("a.json", "b.c.json", ".state", "notes.txt", "z.json"):
        (tdir / name).write_text(json.dumps(HOOK))
    assert spec.names(layout) == ["a", "z"]  # b.c is no trigger name
    assert spec.load(layout, "a").dest == "inbox"
    with pytest.raises(NotFound):
        spec.load(layout, "missing")
    with pytest.raises(NotFound):
        spec.load(layout, "../config/config")
    os.symlink(tdir / "gone", tdir / "dangling.json")
    with pytest.raises(ConfigError, match="broken link"):
        spec.load(layout, "dangling")


def test_the_cache_takes_an_edited_file_again(layout):
    tdir = spec.triggers_dir(layout)
    tdir.mkdir()
    cache = spec.Cache(layout)
    (tdir / "a.json").write_text(json.dumps(HOOK))
    assert cache.get("a").dest == "inbox"
    (tdir / "a.json").write_text(json.dumps({**HOOK, "msg": {"dest": "other-queue"}}))
    assert cache.get("a").dest == "other-queue"


@pytest.mark.parametrize("path, expected", [
    ("$.a.b[0]", 1), ("$.a.b[1].c", "x"), ("$.a", {"b": [1, {"c": "x"}]}),
    ("$.a.b[5]", params.MISSING), ("$.nope", params.MISSING), ("$.a.b.c", params.MISSING),
    ("$.n-1", None), ("$", {"a": {"b": [1, {"c": "x"}]}, "n-1": None})])
def test_json_path_subset(path, expected):
    assert params.lookup({"a": {"b": [1, {"c": "x"}]}, "n-1": None}, path) == expected


@pytest.mark.parametrize("path", ["a.b", "$..a", "$.a[*]", "$['a']", "$.a[-1]", "$.a b"])
def test_json_path_refuses_what_it_does_not_understand(path):
    with pytest.raises(ConfigError):
        params.steps(path)


def test_gather_params_from_body_and_headers():
    got = params.gather({"param1": "$.a", "param2": "header:X-Event", "param3": "$.list",
                         "param4": "header:X-None"}, b'{"a": "x", "list": [1, 2]}',
                        {"X-Event": "push"}.get)
    assert got == {"param1": "x", "param2": "push", "param3": "[1,2]"}
    assert params.gather({"param1": "$.a"}, b"not json", lambda n: None) == {}


def test_secret_files_private_and_one_newline_stripped(tmp_path, monkeypatch):
    path = tmp_path / "s"
    path.write_bytes(b"abc\n\n")
    path.chmod(0o640)
    assert secrets.read_secret({"file": str(path)}) == b"abc\n"
    path.chmod(0o604)
    with pytest.raises(SecretUnreadable, match="others may read"):
        secrets.read_secret({"file": str(path)})
    with pytest.raises(SecretUnreadable, match="No such file"):
        secrets.read_secret({"file": str(tmp_path / "none")})
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(SecretUnreadable, match="CREDENTIALS_DIRECTORY"):
        secrets.read_secret({"credential": "x"})
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert secrets.read_secret({"credential": "s"}) == b"abc\n"  # systemd's own mode


def test_a_delivery_made_into_a_message():
    found = spec.parse("gh", {"webhook": {**HOOK["webhook"], "delivery_header": "X-Id",
                                          "delivery_path": "$.id"},
                              "msg": {"dest": "inbox", "param4": "fixed"},
                              "params": {"param1": "$.id"}}, "gh.json")
    by_header = webhook.Delivery(b'{"id": "e1"}', "application/json; charset=utf-8",
                                 {"X-Id": "d1"}.get)
    msg = webhook.message(found, by_header)
    assert msg == {"dest": "inbox", "param1": "e1", "param4": "fixed",
                   "unique_key": "hook:gh:d1", "unique_for": 604800}
    by_path = webhook.Delivery(b'{"id": "e1"}', "text/plain", lambda n: None)
    assert webhook.message(found, by_path)["unique_key"] == "hook:gh:e1"
    assert webhook.attachment_name(by_header) == "body.json"
    assert webhook.attachment_name(by_path) == "body"
    assert webhook.is_json("application/vnd.github+json")
    fd, md5 = webhook.body_file(b"hello")
    try:
        assert os.read(fd, 10) == b"hello" and md5 == "5d41402abc4b2a76b9719d911017c592"
    finally:
        os.close(fd)
