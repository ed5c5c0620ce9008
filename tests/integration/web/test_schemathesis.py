"""schemathesis over every route of /openapi.json against a real ``rqsys serve``: no 5xx, no hang.

Two servers, as operators run them: on loopback without authentication
(the default), and with ``basic_auth`` (an argon2 hash), fuzzed with the
right credentials; without them, every route of the document answers 401.
Each call has a timeout (a hang fails the case).  The examples are few and
derandomized, to keep the run short and repeatable; ``tests/integration/web/test_web_openapi.py``
checks the answers' shapes against the document on ``rqsys web``.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest
import requests
import schemathesis
from conftest import wait_for
from hypothesis import HealthCheck, settings
from scan_util import LoggedProcess, clean_env, free_port
from schemathesis.checks import not_a_server_error

from rqsys.store import Layout
from rqsys.web import openapi
from rqsys.web.auth import hash_password
from rqsys.wire.client import QueueClient

USER, PASSWORD = "ops", "correct horse"
CALL_TIMEOUT = 15.0  # seconds: an answer slower than this is a hang


@schemathesis.serializer("application/x-ndjson")
def _ndjson(ctx, value) -> bytes:
    """One JSON value a line (the batch enqueue's body)."""
    items = value if isinstance(value, list) else [value]
    return "".join(json.dumps(item) + "\n" for item in items).encode()


schema = schemathesis.openapi.from_dict(openapi.document(""))


class Serve:
    """``rqsys serve`` on 127.0.0.1 with the queue ``api`` and a seed message in prep."""

    def __init__(self, base: Path, auth: bool) -> None:
        self.layout = Layout(base / "root", base / "root" / "sock")
        self.layout.make_dirs()
        self.port = free_port()
        config = {"host": "127.0.0.1", "port": self.port}
        if auth:
            config["basic_auth"] = {"realm": "rqsys", "users": {USER: hash_password(PASSWORD)}}
        self.layout.config_file.write_text(json.dumps(config))
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}"} if auth else {}
        scandir, entry = base / "scandir", base / "api"
        scandir.mkdir()
        entry.mkdir()
        (entry / "run").write_text('#!/bin/bash\necho "done ok" >&3\n')
        (entry / "run").chmod(0o755)
        (scandir / "api").symlink_to(entry)
        self.proc = LoggedProcess(
            [sys.executable, "-m", "rqsys", "--root", str(self.layout.root), "serve",
             "--scandir", str(scandir), "--listen", f"127.0.0.1:{self.port}"],
            base / "serve.log", clean_env(RQ_SOCKET_DIR=str(self.layout.socket_dir)))
        wait_for(self.up, 60, "rqsys serve answering for queue api")
        self.seed_id = self.call("create", msg={"param1": "seed"}, state="prep")["msg_id"]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> bool:
        if self.proc.proc.poll() is not None:
            pytest.fail(f"rqsys serve exited: {self.proc.log()[-2000:]}")
        try:
            answer = requests.get(f"{self.base}/q/api.json", headers=self.headers, timeout=5)
        except requests.RequestException:
            return False
        return answer.status_code == 200

    def call(self, op: str, **args: object) -> dict:
        with QueueClient(self.layout, "api", timeout=30) as client:
            return client.call(op, **args)


@pytest.fixture(scope="module", params=["open", "auth"])
def serve(request, tmp_path_factory):
    server = Serve(tmp_path_factory.mktemp(f"st-{request.param}"), request.param == "auth")
    try:
        yield server
    finally:
        assert server.proc.stop() == 0, server.proc.log()[-2000:]


@schema.parametrize()
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_route_answers_without_5xx_or_hang(case, serve):
    _aim_at_real_things(case, serve.seed_id)
    try:
        case.call_and_validate(base_url=serve.base, headers=serve.headers,
                               checks=[not_a_server_error], timeout=CALL_TIMEOUT)
    finally:
        if case.path.endswith("/adminoper"):  # it may have set the queue DOWN
            serve.call("adminoper", oper="up")


def test_stateful_sequences_answer_without_5xx_or_hang(serve):
    # The document links /q.json to the queue routes and done.json to the
    # message routes: sequences follow a real queue name and message id.
    serve.call("create", msg={"param1": "ends done"})
    wait_for(lambda: serve.call("counts")["counts"].get("done"), 30, "a message in done")

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case):
            return {"base_url": serve.base, "headers": serve.headers, "timeout": CALL_TIMEOUT}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=[not_a_server_error])

    try:
        Workflow.run(settings=settings(max_examples=6, stateful_step_count=5, deadline=None,
                                       derandomize=True, database=None,
                                       suppress_health_check=list(HealthCheck)))
    finally:
        serve.call("adminoper", oper="up")


@pytest.mark.parametrize("serve", ["auth"], indirect=True)
def test_without_credentials_every_route_is_401(serve):
    mid = serve.call("create", msg={"param1": "kept"}, state="prep")["msg_id"]
    for path, item in openapi.document("")["paths"].items():
        url = serve.base + path.replace("{name}", "api").replace("{mid}", mid) \
            .replace("{file}", "stdio.log").replace("{aname}", "x")
        for method in item:
            if path == "/hooks/{trigger}" and method == "post":
                continue  # a signed webhook takes no credentials: its signature is its auth
            # (tests/integration/triggers/test_webhooks.py: 401 for a bad signature)
            answer = requests.request(method.upper(), url, timeout=CALL_TIMEOUT,
                                      data={"_method": "delete"})
            assert answer.status_code == 401, (method, path, answer.status_code, answer.text)
    assert serve.call("state", msg_id=mid)["state"] == "prep"


def _aim_at_real_things(case, seed_id: str) -> None:
    """Random names mostly miss; point about half the cases at the real queue and message."""
    params = case.path_parameters or {}
    if "name" in params and len(str(params["name"])) % 2 == 0:
        params["name"] = "api"
        if "mid" in params and len(str(params["mid"])) % 2 == 0:
            params["mid"] = seed_id
