"""The failed-login backoff's policy in process (rqsys.web.backoff), with a fake
clock: the schedule, its three scopes, what a success clears, checks racing in
parallel, bounded tables; and the basic-auth middleware's use of it: 429 with
Retry-After and no argon2 run while a backoff applies."""

from __future__ import annotations

import base64
import threading

import falcon
import falcon.testing
import pytest

from rqsys.web import auth, backoff
from rqsys.web.backoff import ADDRESS_FREE, CAP, FORGET, PAIR_FREE, USER_FREE, Gate, who

USERS = ("alice", "bob", "carol")


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def lines() -> list[str]:
    return []


@pytest.fixture
def gate(clock: Clock, lines: list[str]) -> Gate:
    return Gate(clock=clock, log=lines.append)


def attempt(gate: Gate, address: str, user: str = "alice", ok: bool = False):
    """One login try; the (scope, seconds) refusal, or None when it was let in."""
    ticket = gate.enter(who(address, user, user in USERS))
    if ticket.refused is None:
        gate.leave(ticket, ok, "password" if user in USERS else "user")
    return ticket.refused


def fail(gate: Gate, address: str, times: int, user: str = "alice") -> None:
    for _ in range(times):
        assert attempt(gate, address, user) is None


def fail_waiting(gate: Gate, clock: Clock, address: str, times: int) -> None:
    """``times`` failures, each after the wait the one before set."""
    for _ in range(times):
        refused = attempt(gate, address)
        if refused is not None:
            clock.now += refused[1]
            assert attempt(gate, address) is None


# ---------------------------------------------------------------- the schedule
def test_the_delay_starts_at_one_second_after_the_free_failures_and_doubles_to_the_cap():
    assert [backoff.delay(n, 10) for n in (0, 9)] == [0.0, 0.0]
    assert [backoff.delay(n, 10) for n in range(10, 16)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert backoff.delay(18, 10) == 256.0 and backoff.delay(19, 10) == CAP == 300.0
    assert backoff.delay(10**6, 10) == CAP  # no overflow however many


def test_wrong_passwords_from_one_address_back_off_then_a_try_is_allowed(gate, clock):
    fail(gate, "192.0.2.1", PAIR_FREE)
    assert attempt(gate, "192.0.2.1") == ("user_address", 1)
    clock.now += 0.5
    assert attempt(gate, "192.0.2.1", ok=True) == ("user_address", 1)  # even the right one
    clock.now += 0.5
    assert attempt(gate, "192.0.2.1") is None  # the wait is over: one more try
    assert attempt(gate, "192.0.2.1") == ("user_address", 2)  # and the next wait doubled
    clock.now += 2
    assert attempt(gate, "192.0.2.1", ok=True) is None


def test_the_right_password_from_another_address_is_not_slowed(gate, clock):
    fail_waiting(gate, clock, "192.0.2.1", PAIR_FREE + 5)
    assert attempt(gate, "192.0.2.1")[0] == "user_address"
    assert attempt(gate, "192.0.2.2", ok=True) is None
    assert attempt(gate, "192.0.2.1", user="bob", ok=True) is None  # another user there too


def test_one_address_guessing_many_users_backs_off_for_every_user(gate):
    # Given failures spread over three users (none reaching its own limit)
    for n in range(ADDRESS_FREE):
        assert attempt(gate, "192.0.2.1", USERS[n % 3]) is None
    # Then the address is refused for any user, known or not
    assert attempt(gate, "192.0.2.1", "carol") == ("address", 1)
    assert attempt(gate, "192.0.2.1", "mallory") == ("address", 1)
    # and another address is not
    assert attempt(gate, "192.0.2.2", "alice", ok=True) is None


def test_made_up_user_names_share_one_record_per_address(gate):
    for n in range(PAIR_FREE):
        assert attempt(gate, "192.0.2.1", f"guess{n}") is None
    assert attempt(gate, "192.0.2.1", "another") == ("user_address", 1)
    assert len(gate.tables["user_address"].records) == 1
    assert "user" not in dict(who("192.0.2.1", "x", known=False).counted())


def test_a_user_attacked_from_many_addresses_refuses_the_failed_ones_only(gate):
    # Given one failure for alice from each of 50 addresses
    for n in range(USER_FREE):
        assert attempt(gate, f"198.51.100.{n}") is None
    # Then an address that failed for her waits, even with her password
    assert attempt(gate, "198.51.100.7", ok=True) == ("user", 1)
    # but her password from an address that never failed is let in
    assert attempt(gate, "203.0.113.9", ok=True) is None
    # a new guesser's address gets one try, then waits with the others
    assert attempt(gate, "203.0.113.66") is None
    assert attempt(gate, "203.0.113.66") == ("user", 2)
    # and bob is not slowed from those addresses
    assert attempt(gate, "198.51.100.7", "bob", ok=True) is None


def test_a_success_clears_the_pair_but_not_the_address(gate):
    fail(gate, "192.0.2.1", PAIR_FREE - 1)
    assert attempt(gate, "192.0.2.1", ok=True) is None
    assert ("alice", "192.0.2.1") not in gate.tables["user_address"].records
    fail(gate, "192.0.2.1", PAIR_FREE - 1)  # a fresh budget for alice here
    assert gate.tables["address"].records["192.0.2.1"].failures == 2 * (PAIR_FREE - 1)
    fail(gate, "192.0.2.1", ADDRESS_FREE - 2 * (PAIR_FREE - 1), user="bob")
    assert attempt(gate, "192.0.2.1", ok=True) == ("address", 1)


def test_records_are_forgotten_after_an_hour_without_a_failure(gate, clock):
    fail_waiting(gate, clock, "192.0.2.1", PAIR_FREE + 9)
    assert attempt(gate, "192.0.2.1") == ("user_address", int(CAP))
    clock.now += CAP  # a guesser waiting out the cap keeps its record
    fail(gate, "192.0.2.1", 1)
    assert attempt(gate, "192.0.2.1") == ("user_address", int(CAP))
    clock.now += FORGET + 1  # an hour of quiet forgets it
    assert attempt(gate, "192.0.2.1") is None
    assert gate.tables["user_address"].records[("alice", "192.0.2.1")].failures == 1


# ---------------------------------------------------------------- threads and memory
def test_checks_racing_at_the_edge_of_a_backoff_are_let_in_one_at_a_time(gate):
    fail(gate, "192.0.2.1", PAIR_FREE - 1)
    start = threading.Barrier(16)
    tickets: list[backoff.Ticket] = []

    def guess() -> None:
        start.wait()
        tickets.append(gate.enter(who("192.0.2.1", "alice", True)))

    threads = [threading.Thread(target=guess) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    admitted = [t for t in tickets if t.refused is None]
    assert len(admitted) == 1
    assert {t.refused for t in tickets if t.refused} == {("user_address", 1)}
    gate.leave(admitted[0], False)
    assert attempt(gate, "192.0.2.1") == ("user_address", 1)  # the backoff, not a race
    assert gate.counts.refused["user_address"] == 16


def test_many_threads_count_every_failure(gate):
    def guess(n: int) -> None:
        for k in range(200):
            attempt(gate, f"10.{n}.{k}.1", USERS[k % 3])

    threads = [threading.Thread(target=guess, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert gate.counts.failures["password"] + sum(gate.counts.refused.values()) == 1600
    assert all(r.busy == 0 for t in gate.tables.values() for r in t.records.values())


def _nth(n: int) -> str:
    return f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}"


def test_the_tables_stay_bounded_whatever_the_number_of_addresses(gate):
    many = backoff.TABLE_MAX + 500
    for n in range(many):
        assert attempt(gate, _nth(n), "mallory") is None
    for table in ("address", "user_address"):
        assert len(gate.tables[table].records) == backoff.TABLE_MAX
    kept = gate.tables["address"].records
    assert _nth(499) not in kept and _nth(500) in kept  # the oldest went first
    assert _nth(many - 1) in kept and gate.counts.failures["user"] == many


def test_addresses_are_counted_ipv4_whole_and_ipv6_by_their_64():
    assert backoff.address_key("192.0.2.1") == "192.0.2.1"
    assert backoff.address_key("2001:db8:1:2::5") == backoff.address_key("2001:db8:1:2:ffff::9")
    assert backoff.address_key("2001:db8:1:2::5") == "2001:db8:1:2::/64"
    assert backoff.address_key("2001:db8:1:3::5") != backoff.address_key("2001:db8:1:2::5")
    assert backoff.address_key("::ffff:192.0.2.1") == "192.0.2.1"
    assert backoff.address_key("fe80::1%eth0") == "fe80::/64"
    assert backoff.address_key(None) == "-"
    assert backoff.address_key("x" * 500) == "x" * 64


# ---------------------------------------------------------------- log and counts
def test_the_log_has_a_line_per_failure_and_one_per_backoff(gate, lines):
    fail(gate, "192.0.2.1", PAIR_FREE, user="alice")
    assert lines[0] == "login failed: user 'alice' from 192.0.2.1 (wrong password)"
    assert len(lines) == PAIR_FREE + 1
    assert lines[-1] == "login backoff: user 'alice' from 192.0.2.1: 10 failures, refused for 1 s"
    attempt(gate, "192.0.2.1")  # refused: no line (a flood would fill the log)
    assert len(lines) == PAIR_FREE + 1
    assert gate.counts.backoffs == {"address": 0, "user_address": 1, "user": 0}


def test_a_hostile_user_name_is_shown_escaped_and_cut(gate, lines):
    attempt(gate, "192.0.2.1", "evil\nrqsys web: forged line\x1b[31m" + "x" * 200)
    assert len(lines) == 1 and "\n" not in lines[0] and "\x1b" not in lines[0]
    assert "'evil\\nrqsys web: forged line\\x1b[31m" in lines[0]
    assert "(no such user)" in lines[0] and len(lines[0]) < 150


# ---------------------------------------------------------------- the middleware
class CountingVerifier(auth.Verifier):
    """The real verifier, counting the checks it is asked for."""

    def __init__(self, users: dict[str, str]) -> None:
        super().__init__(users)
        self.checks = 0

    def check(self, user: str, password: str) -> bool:
        self.checks += 1
        return super().check(user, password)


def _request(address: str, header: str | None) -> falcon.Request:
    headers = {"Authorization": header} if header is not None else {}
    return falcon.testing.create_req(path="/q.json", headers=headers, remote_addr=address)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def middleware(gate):
    basic = auth.BasicAuth({"realm": "r", "users": {"alice": "right"}}, gate)
    basic.verifier = CountingVerifier({"alice": "right"})
    return basic


def test_the_middleware_answers_429_with_retry_after_and_checks_nothing(middleware, gate):
    for _ in range(PAIR_FREE):
        with pytest.raises(falcon.HTTPUnauthorized):
            middleware.process_request(_request("192.0.2.1", _basic("alice", "wrong")), None)
    assert middleware.verifier.checks == PAIR_FREE
    with pytest.raises(falcon.HTTPTooManyRequests) as refused:
        middleware.process_request(_request("192.0.2.1", _basic("alice", "right")), None)
    assert refused.value.headers["Retry-After"] == "1"
    assert middleware.verifier.checks == PAIR_FREE  # no check while backing off
    req = _request("192.0.2.2", _basic("alice", "right"))
    middleware.process_request(req, None)
    assert req.context.user == "alice"


@pytest.mark.parametrize("header", ["Basic !!!", "Basic " + base64.b64encode(b"\xff:\xfe").decode(),
                                    "Basic " + base64.b64encode(b"no colon").decode()])
def test_undecodable_credentials_are_failures(middleware, gate, lines, header):
    with pytest.raises(falcon.HTTPUnauthorized):
        middleware.process_request(_request("192.0.2.1", header), None)
    assert gate.counts.failures == {"password": 0, "user": 0, "malformed": 1}
    assert lines == ["login failed: user (undecodable) from 192.0.2.1 (undecodable credentials)"]
    assert middleware.verifier.checks == 0


def test_no_credentials_is_a_challenge_not_a_failure(middleware, gate, lines):
    for header in (None, "Bearer abc"):
        with pytest.raises(falcon.HTTPUnauthorized):
            middleware.process_request(_request("192.0.2.1", header), None)
    assert sum(gate.counts.failures.values()) == 0 and lines == []
