"""The queue works end to end: a real daemon runs a real script to done."""

from conftest import wait_for

from rqsys.store import QueueStore


def test_message_reaches_done(layout, make_queue, daemon):
    # Given a queue whose script says done
    make_queue("hello", 'echo "hi $RQ_PARAM1"\necho "done greeted" >&3\n')
    proc = daemon("hello")
    # When a message is sent over the socket
    reply = proc.call("create", msg={"param1": "world"})
    # Then it reaches done with the script's status and output
    store = QueueStore(layout.queue_dir("hello"))
    wait_for(lambda: proc.call("state", msg_id=reply["msg_id"])["state"] == "done",
             what="done")
    assert store.read_status("done", reply["msg_id"]) == "greeted"
    log = store.msg_dir("done", reply["msg_id"]) / "job" / "stdio.log"
    assert log.read_text() == "hi world\n"
    assert proc.stop() == 0
