"""SandboxFusion backend: the HTTP service the upstream recipe executes code on.

For cluster users who already run SandboxFusion (``sandbox.backend: sandbox_fusion``,
``sandbox.sandbox_fusion_url``). Same interface as the local sandbox; the service does the
isolation (see its own documentation), this client only maps the API:

``POST {url}/run_code`` with ``{code, language: "python", stdin, run_timeout, compile_timeout,
memory_limit_MB, files: {}, fetch_files: []}``, answered by ``{status: Success | Failed |
SandboxError, message, run_result: {status: Finished | TimeLimitExceeded | Error,
execution_time, return_code, stdout, stderr}, ...}`` (bytedance/SandboxFusion,
``sandbox/server/sandbox_api.py``).

Mapping to :class:`ExecutionResult`: ``Finished`` with return code 0 -> ``ok``, another code ->
``error`` (negative: a signal -> ``killed``); ``TimeLimitExceeded`` -> ``timeout``; ``Error``,
``SandboxError``, HTTP and connection failures -> ``killed`` with ``exit_code`` None and the
reason in ``stderr``: infrastructure failures (``ExecutionResult.outcome``), never the program's. Output is capped at ``max_output_bytes`` per stream like the local
backend. Like verl's client, failed requests (connection errors, HTTP 5xx) are retried with
backoff; a result always comes back.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

from agentrl.config import SandboxConfig
from agentrl.errors import UserInputError
from agentrl.tools.sandbox import ExecutionResult, Sandbox, lost_result

logger = logging.getLogger(__name__)

_ATTEMPTS = 3
_BACKOFF_S = 0.5
# The service needs time beyond the run's own timeout (queueing, container start).
_HTTP_GRACE_S = 30.0


def run_code_url(url: str) -> str:
    """Accept the service's base URL or the full ``/run_code`` endpoint (verl's configs use the latter)."""
    url = url.rstrip("/")
    return url if url.endswith("/run_code") else f"{url}/run_code"


def _cap(text: str | None, max_bytes: int) -> tuple[str, bool]:
    data = (text or "").encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text or "", False
    return data[:max_bytes].decode("utf-8", "replace"), True


class SandboxFusionUnreachable(UserInputError):
    """``sandbox.sandbox_fusion_url`` does not answer at all when a stage starts."""


_PROBE_TIMEOUT_S = 10.0


def probe_service(cfg: SandboxConfig) -> None:
    """Raise SandboxFusionUnreachable unless something answers at ``sandbox.sandbox_fusion_url``.

    Run when a stage makes its sandbox: a wrong URL or a service not started would otherwise turn
    every tool call into an infrastructure failure, and the URL would show only in retry warnings.
    Any HTTP answer (an error status too) means the service is there; later losses stay
    infrastructure failures of the calls they hit (:mod:`agentrl.tools.health`).
    """
    url = run_code_url(cfg.sandbox_fusion_url)
    body = json.dumps({"code": "print(1)", "language": "python", "run_timeout": 5, "compile_timeout": 5})
    request = urllib.request.Request(url, data=body.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=_PROBE_TIMEOUT_S) as response:
            response.read()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SandboxFusionUnreachable(
            f"sandbox.sandbox_fusion_url = {cfg.sandbox_fusion_url!r}: no SandboxFusion service answers at {url} "
            f"({reason}); start the service or fix the URL (or use sandbox.backend: local)"
        ) from None


class SandboxFusionSandbox(Sandbox):
    """Runs code on a SandboxFusion service; ``sandbox.workers`` requests in flight at most."""

    def __init__(self, cfg: SandboxConfig):
        super().__init__(cfg.workers, cfg.max_queue_wait_s)
        self.config = cfg
        self.url = run_code_url(cfg.sandbox_fusion_url)

    def run(
        self, code: str, stdin: str | None = None, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> ExecutionResult:
        timeout = self._check_request(code, stdin, timeout_s, self.config.timeout_s)
        self._check_open()
        payload = {
            "code": code,
            "language": "python",
            "stdin": stdin,
            "run_timeout": timeout,
            "compile_timeout": timeout,
            "memory_limit_MB": self.config.memory_mb if memory_mb is None else memory_mb,
            "files": {},
            "fetch_files": [],
        }
        started = time.monotonic()
        try:
            answer = self._post(payload, timeout + _HTTP_GRACE_S)
        except _RequestFailed as exc:
            logger.warning("sandbox_fusion: %s", exc)
            return lost_result(f"sandbox error: {exc}", time.monotonic() - started)
        try:
            return self._to_result(answer, time.monotonic() - started)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            return lost_result(f"sandbox error: malformed SandboxFusion answer ({exc!r}): {str(answer)[:300]}")

    def _post(self, payload: dict[str, Any], http_timeout_s: float) -> dict[str, Any]:
        body = json.dumps(payload).encode("utf-8", "surrogatepass")
        last_error = "no attempt made"
        for attempt in range(_ATTEMPTS):
            if attempt:
                time.sleep(_BACKOFF_S * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=http_timeout_s) as response:
                    return json.loads(response.read().decode("utf-8"))
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode("utf-8", "replace")[:500]
                last_error = f"POST {self.url} answered HTTP {exc.code}: {detail}"
                if exc.code < 500:
                    break  # the request itself is wrong: retrying cannot help
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last_error = f"POST {self.url} failed: {exc}"
        raise _RequestFailed(f"{last_error} (after {attempt + 1} attempt(s))")

    def _to_result(self, answer: dict[str, Any], elapsed_s: float) -> ExecutionResult:
        run = answer.get("run_result") or {}
        if answer.get("status") == "SandboxError" or run.get("status") in (None, "Error"):
            reason = answer.get("message") or run.get("stderr") or f"no run result in {str(answer)[:300]}"
            return lost_result(f"sandbox error: SandboxFusion: {reason}", elapsed_s)
        cap = self.config.max_output_bytes
        stdout, cut_out = _cap(run.get("stdout"), cap)
        stderr, cut_err = _cap(run.get("stderr"), cap)
        return_code = run.get("return_code")
        if run["status"] == "TimeLimitExceeded":
            status = "timeout"
        elif return_code is None or return_code < 0:
            status = "killed"
        else:
            status = "ok" if return_code == 0 else "error"
        duration = run.get("execution_time")
        return ExecutionResult(
            status=status,
            stdout=stdout,
            stderr=stderr,
            exit_code=return_code,
            duration_s=float(duration) if duration is not None else elapsed_s,
            truncated=cut_out or cut_err,
        )


class _RequestFailed(Exception):
    pass
