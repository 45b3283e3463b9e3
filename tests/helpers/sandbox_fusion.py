"""A local SandboxFusion ``/run_code`` service over a real local sandbox, with switches to make it
fail (imported by tests/test_sandbox_fusion.py and tests/test_tool_health.py).

It checks each request's fields against the service's API (422 on a wrong type), answers from a
:class:`agentrl.tools.sandbox.LocalSandbox` run, and can answer injected HTTP errors or a
``SandboxError`` instead.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agentrl.tools.sandbox import LocalSandbox

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
