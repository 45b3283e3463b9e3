"""The SandboxFusion backend against a small server that speaks SandboxFusion's ``/run_code`` API.

The server (stdlib ``http.server`` in a thread) validates requests like the service's pydantic
model and executes the code on the local sandbox, answering in the service's schema
(``RunCodeResponse``: status Success | Failed | SandboxError, run_result with status Finished |
TimeLimitExceeded | Error).
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

import pytest
from helpers.sandbox_fusion import FakeSandboxFusion

from agentrl.config import load_config
from agentrl.tools import sandbox_fusion
from agentrl.tools.code_interpreter import CodeInterpreter
from agentrl.tools.factory import make_sandbox
from agentrl.tools.sandbox import LocalSandbox
from agentrl.tools.sandbox_fusion import SandboxFusionSandbox, run_code_url


@pytest.fixture(scope="module")
def server():
    backend_cfg = load_config({"sandbox": {"workers": 2, "preload_modules": []}}).sandbox
    with LocalSandbox(backend_cfg) as backend:
        fake = FakeSandboxFusion(backend)
        thread = threading.Thread(target=fake.serve_forever, daemon=True)
        thread.start()
        yield fake
        fake.shutdown()
        fake.server_close()


@pytest.fixture()
def client(server, monkeypatch):
    monkeypatch.setattr(sandbox_fusion, "_BACKOFF_S", 0.01)
    server.requests.clear()
    server.http_failures.clear()
    server.sandbox_error = False
    cfg = load_config(
        {
            "sandbox": {
                "backend": "sandbox_fusion",
                "sandbox_fusion_url": server.url,
                "workers": 3,
                "timeout_s": 5,
                "memory_mb": 2048,
                "max_output_bytes": 1024,
            }
        }
    ).sandbox
    with make_sandbox(cfg) as fusion:
        server.requests.clear()  # the start probe's
        yield fusion


def test_make_sandbox_builds_the_http_backend(client, server):
    assert isinstance(client, SandboxFusionSandbox) and client.url == server.url + "/run_code"
    assert run_code_url("http://host:8080/run_code") == run_code_url("http://host:8080/") == "http://host:8080/run_code"


def test_request_follows_the_api(client, server):
    result = client.run("print(input()[::-1])", stdin="abc\n", timeout_s=3)
    assert (result.status, result.stdout, result.exit_code) == ("ok", "cba\n", 0)
    (request,) = server.requests
    assert request == {
        "code": "print(input()[::-1])",
        "language": "python",
        "stdin": "abc\n",
        "run_timeout": 3.0,
        "compile_timeout": 3.0,
        "memory_limit_MB": 2048,
        "files": {},
        "fetch_files": [],
    }


def test_statuses_map_to_execution_results(client):
    error = client.run("import sys\nprint('partial')\nsys.exit(4)")
    assert (error.status, error.exit_code, error.stdout) == ("error", 4, "partial\n")
    timeout = client.run("while True:\n    pass", timeout_s=0.5)
    assert (timeout.status, timeout.exit_code) == ("timeout", None)
    killed = client.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert (killed.status, killed.exit_code) == ("killed", -9)


def test_sandbox_error_is_a_lost_result(client, server):
    server.sandbox_error = True
    result = client.run("print(1)")
    assert (result.status, result.exit_code) == ("killed", None)
    assert "no executor available" in result.stderr


def test_server_errors_are_retried(client, server):
    server.http_failures[:] = [500, 502]
    assert client.run("print(1)").stdout == "1\n"
    assert len(server.requests) == 3
    server.http_failures[:] = [503, 503, 503]
    gave_up = client.run("print(1)")
    assert (gave_up.status, gave_up.exit_code) == ("killed", None) and "HTTP 503" in gave_up.stderr


def test_client_errors_are_not_retried(client, server):
    server.http_failures[:] = [422]
    result = client.run("print(1)")
    assert result.status == "killed" and "HTTP 422" in result.stderr and len(server.requests) == 1


def test_unreachable_service_gives_a_result_not_an_exception(client):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]  # nothing listens once the probe is closed
    cfg = dataclasses.replace(client.config, sandbox_fusion_url=f"http://127.0.0.1:{dead_port}")
    with SandboxFusionSandbox(cfg) as unreachable:
        result = unreachable.run("print(1)")
    assert (result.status, result.exit_code) == ("killed", None) and "failed" in result.stderr


def test_output_is_capped_like_the_local_backend(client):
    result = client.run("print('z' * 5000)")
    assert (result.status, result.truncated, result.stdout) == ("ok", True, "z" * 1024)


def test_run_many_is_concurrent_and_ordered(client):
    started = time.monotonic()
    results = client.run_many([(f"import time\ntime.sleep(0.3)\nprint({i})", None) for i in range(4)])
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
    assert time.monotonic() - started < 0.8 * 4 * 0.3, "requests must be in flight concurrently"


def test_code_interpreter_over_sandbox_fusion(client):
    tool = CodeInterpreter(client, load_config({}).tool)
    assert tool.execute("```python\nx = 7\nx * 6\n```").text == "42\n"
    failed = tool.execute("1 / 0")
    assert not failed.ok and "ZeroDivisionError" in failed.text


def test_malformed_answers_give_a_result(client, server, monkeypatch):
    garbled = {"status": "Success", "run_result": {"status": "Finished", "return_code": "zero"}}
    monkeypatch.setattr(server, "answer", lambda request: garbled)
    result = client.run("print(1)")
    assert (result.status, result.exit_code) == ("killed", None) and "malformed" in result.stderr
