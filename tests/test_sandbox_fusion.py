"""The SandboxFusion backend against a small server that speaks SandboxFusion's ``/run_code`` API.

The server (stdlib ``http.server`` in a thread) validates requests like the service's pydantic
model and executes the code on the local sandbox, answering in the service's schema
(``RunCodeResponse``: status Success | Failed | SandboxError, run_result with status Finished |
TimeLimitExceeded | Error).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentrl.config import load_config
from agentrl.tools import sandbox_fusion
from agentrl.tools.code_interpreter import CodeInterpreter
from agentrl.tools.sandbox import LocalSandbox, make_sandbox
from agentrl.tools.sandbox_fusion import SandboxFusionSandbox, run_code_url

_REQUIRED = {"code": str, "language": str}
_OPTIONAL = {
    "compile_timeout": (int, float),
    "run_timeout": (int, float),
    "memory_limit_MB": int,
    "stdin": (str, type(None)),
    "files": dict,
    "fetch_files": list,
    "args": list,
}


class FakeSandboxFusion(ThreadingHTTPServer):
    """SandboxFusion's /run_code over a local sandbox, with switches to make it fail."""

    daemon_threads = True

    def __init__(self, backend: LocalSandbox):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.backend = backend
        self.requests: list[dict] = []
        self.http_failures: list[int] = []  # status codes to answer, one per request, before working
        self.sandbox_error = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def answer(self, request: dict) -> dict:
        if self.sandbox_error:
            return {"status": "SandboxError", "message": "no executor available", "run_result": None, "files": {}}
        result = self.backend.run(request["code"], request.get("stdin"), request.get("run_timeout", 10))
        run_status = "TimeLimitExceeded" if result.status == "timeout" else "Finished"
        if result.status == "killed" and result.exit_code is None:
            run_status = "Error"
        status = "Success" if run_status == "Finished" and result.exit_code == 0 else "Failed"
        run_result = {
            "status": run_status,
            "execution_time": result.duration_s,
            "return_code": None if run_status == "TimeLimitExceeded" else result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
        }
        return {
            "status": status,
            "message": "",
            "compile_result": None,
            "run_result": run_result,
            "executor_pod_name": None,
            "files": {},
        }


class _Handler(BaseHTTPRequestHandler):
    server: FakeSandboxFusion

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/run_code":
            return self._send(404, {"detail": "Not Found"})
        self.server.requests.append(body)
        if self.server.http_failures:
            return self._send(self.server.http_failures.pop(0), {"detail": "injected failure"})
        problems = [k for k, t in _REQUIRED.items() if not isinstance(body.get(k), t)]
        problems += [k for k, t in _OPTIONAL.items() if k in body and not isinstance(body[k], t)]
        if problems or body["language"] != "python":
            return self._send(422, {"detail": f"invalid fields {problems}"})
        return self._send(200, self.server.answer(body))


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
