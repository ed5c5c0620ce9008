"""Unit tests of the roles: what each includes, accounts from the config, a
peer's role from its groups, and every socket operation named."""

from __future__ import annotations

import pytest

from rqsys.daemon import observe, searchops
from rqsys.errors import Forbidden
from rqsys.wire import roles, schema


def test_a_role_includes_the_ones_below_it() -> None:
    assert roles.covers("admin", "viewer") and roles.covers("admin", "operator")
    assert roles.covers("operator", "viewer") and not roles.covers("operator", "admin")
    assert not roles.covers("viewer", "operator")
    assert not roles.covers(roles.NOBODY, "viewer") and not roles.covers("root", "viewer")


def test_accounts_from_basic_auth_users() -> None:
    got = roles.accounts({"users": {
        "old": "$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA",
        "ann": {"password": "$argon2id$x", "role": "viewer", "queues": ["etl-*"]},
        "bob": {"password": "$argon2id$y", "role": "operator"}}})
    assert got["old"] == roles.Account("$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA", "admin")
    assert got["ann"] == roles.Account("$argon2id$x", "viewer", ("etl-*",))
    assert got["bob"].queues is None and got["bob"].may("operator", "any")
    assert roles.accounts(None) == {}


def test_queues_narrow_what_a_user_sees_and_does() -> None:
    ann = roles.Account("h", "operator", ("etl-*", "mail"))
    assert ann.sees("etl-nightly") and ann.sees("mail") and not ann.sees("mailer")
    assert ann.may("operator", "etl-1") and not ann.may("operator", "billing")
    assert not ann.may("admin", "etl-1")
    with pytest.raises(Forbidden, match=r"needs the operator role on queue billing "
                                        r"\(you have: operator\)"):
        ann.require("operator", "billing")
    with pytest.raises(Forbidden, match=r"needs the admin role on queue etl-1"):
        ann.require("admin", "etl-1")


def test_a_peers_role_is_its_best_group() -> None:
    named = {"rq-admin": 10, "rq": 11, "rq-view": 12}
    assert roles.role_of_groups({12}, named) == "viewer"
    assert roles.role_of_groups({12, 11}, named) == "operator"
    assert roles.role_of_groups({12, 11, 10}, named) == "admin"
    assert roles.role_of_groups({99}, named) == roles.NOBODY
    assert roles.role_of_groups({11}, {"rq-view": 12}) == roles.NOBODY  # no group rq here


def test_every_socket_operation_has_its_role_named() -> None:
    ops = {*schema.OPS, *observe.SCHEMAS, *searchops.SCHEMAS, "pool"}
    assert ops <= set(roles.OPS), ops - set(roles.OPS)
    reads = {op for op in ops if roles.op_role(op) == "viewer"}
    assert {"create", "delete", "destroy", "retry", "bulk", "adminoper"}.isdisjoint(reads)
    assert roles.op_role("adminoper") == roles.op_role("reload") == "admin"
    assert roles.op_role("made-up") == "admin"  # an op not named needs the most
