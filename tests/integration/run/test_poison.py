"""No poison message (issue 14, item 3): every field's limit is enforced at
create with the field and the limit named (socket and rq); a message whose
script cannot be started for its own sake (E2BIG) ends in err alone and the
queue goes on; SCRIPTERROR stays for the queue's own script."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import wait_for
from daemon_util import send, settle, store_of

from rqsys import message
from rqsys.errors import BadRequest
from rqsys.run import spawn

KIB = 1024
RQ = [sys.executable, "-c", "import sys; from rqsys.cli.rq import rq_main; sys.exit(rq_main())"]
DONE = 'echo "done ran $RQ_PARAM1" | cut -c1-40 >&3'


# ---------------------------------------------------------------- limits at create
@pytest.mark.parametrize(("field", "value", "limit"), [
    ("param1", "x" * (200 * KIB), "102400 bytes"),
    ("param4", "é" * (51 * KIB), "102400 bytes"),  # UTF-8 bytes, not characters
    ("src", "s" * 3000, "2048 bytes"),
])
def test_an_oversized_field_is_refused_at_create_naming_field_and_limit(
        make_queue, daemon, layout, field, value, limit):
    make_queue("q", DONE)
    proc = daemon("q")
    with pytest.raises(BadRequest, match=rf"^{field} too large: \d+ bytes, the limit is {limit}"):
        send(proc, **{field: value})
    # Nothing was stored, and the queue takes the next message
    assert proc.call("counts")["counts"]["que"] == 0
    assert settle(proc, send(proc, param1="small"))["state"] == "done"


def test_each_limit_alone():
    message.check_message({"param1": "x" * message.PARAM_MAX, "param2": "y" * message.PARAM_MAX})
    with pytest.raises(BadRequest, match=r"post_run_webhook\[1\] too large"):
        message.check_message({"post_run_webhook": ["http://a/", "http://" + "a" * 3000]})
    with pytest.raises(BadRequest, match="param2 contains a NUL"):
        message.check_message({"param2": "a\0b"})
    with pytest.raises(BadRequest, match=r"message too large: \d+ bytes as JSON, the limit "
                                         r"is 1048576"):
        message.check_message({"relay_via": ["\u0001" * 2000] * 64,
                              **{f"param{n}": "\u0001" * 16000 for n in range(1, 5)}})


def test_the_limits_leave_room_for_the_script(tmp_path):
    # A message at every limit still fits in one exec with a usual environment
    env = dict(os.environ, **{f"RQ_PARAM{n}": "x" * message.PARAM_MAX for n in range(1, 5)},
               RQ_ORIG_MSG_ID="u" * message.TEXT_MAX)
    assert spawn.env_problem(env) == ""
    done = subprocess.run(["/bin/true"], env=env, check=False)
    assert done.returncode == 0
    assert "RQ_PARAM1" in spawn.env_problem({"RQ_PARAM1": "x" * spawn.MAX_ARG_STRLEN})


def test_rq_refuses_an_oversized_param_in_one_line(make_queue, daemon, layout):
    make_queue("q", DONE)
    daemon("q")
    big = "x" * (110 * KIB)  # over the limit, under what one argv string may be
    out = subprocess.run([*RQ, "--root", str(layout.root), "sendmesg", "--dest", "q",
                          f"--param1={big}"], capture_output=True, text=True, check=False)
    assert out.returncode not in (0, 2), out
    assert out.stdout.startswith("fail ") and "param1 too large" in out.stdout
    assert out.stderr.startswith("rq: ") and out.stderr.count("\n") == 1
    assert "the limit is 102400 bytes" in out.stderr


# ---------------------------------------------------------------- at run time
def test_a_message_whose_environment_cannot_be_execd_ends_err_alone(make_queue, daemon,
                                                                    layout):
    # Given a 200 KB param already in que/ (written before the limits existed)
    make_queue("q", DONE)
    store = store_of(layout, "q")
    poisoned = store.create({"dest": "q", "param1": "p" * (200 * KIB), "count": 0, "due": 0})
    proc = daemon("q")
    # Then it ends in err with the reason, alone
    reply = settle(proc, poisoned)
    assert reply["state"] == "err"
    assert "Argument list too long" in reply["status"]
    assert "RQ_PARAM1" in reply["status"] and "131072" in reply["status"]
    # And the queue goes on: no SCRIPTERROR, the next message runs
    assert not proc.call("counts")["status"].startswith("SCRIPTERROR")
    assert settle(proc, send(proc, param1="next"))["status"] == "ran next"


def test_a_message_pushed_over_arg_max_by_env_vars_ends_err_alone(make_queue, daemon):
    # Given env_vars that leave about 150 KiB of ARG_MAX for each message
    fill = spawn.arg_max() - spawn.env_size(dict(os.environ)) - 150 * KIB
    chunk = 100 * KIB
    env_vars = {f"BIG{n}": "b" * chunk for n in range(fill // (chunk + 16))}
    env_vars["BIGREST"] = "b" * (fill - spawn.env_size(env_vars) - 16)
    assert abs(spawn.env_size(env_vars) - fill) < 64
    make_queue("q", DONE, env_vars=env_vars)
    proc = daemon("q")
    # When a message within every limit but with 2 x 99 KiB of params comes first
    heavy = send(proc, param1="h" * (99 * KIB), param2="h" * (99 * KIB))
    light = send(proc, param1="light")
    # Then it alone ends in err; the next runs
    reply = settle(proc, heavy)
    assert reply["state"] == "err" and "Argument list too long" in reply["status"]
    assert "ARG_MAX" in reply["status"]
    assert settle(proc, light)["status"] == "ran light"


def test_a_missing_script_is_still_scripterror(make_queue, daemon):
    entry = make_queue("q", DONE)
    proc = daemon("q")
    os.unlink(entry / "run")
    msg_id = send(proc)
    wait_for(lambda: proc.call("counts")["status"].startswith("SCRIPTERROR"),
             what="SCRIPTERROR")
    assert proc.call("state", msg_id=msg_id)["state"] == "que"


def test_a_script_that_cannot_exec_is_scripterror_not_the_messages_fault(make_queue, daemon):
    # Given a script that is executable but whose interpreter does not exist (ENOENT)
    make_queue("q", DONE, shebang="#!/nonexistent/interpreter")
    proc = daemon("q")
    msg_id = send(proc)
    wait_for(lambda: proc.call("counts")["status"].startswith("SCRIPTERROR"),
             what="SCRIPTERROR")
    # Then the message waits in que, untouched
    assert proc.call("status", msg_id=msg_id)["state"] == "que"
    assert proc.call("get", msg_id=msg_id)["msg"]["count"] == 0
