"""The local sandbox: behaves like ``python main.py``, and each protection resists an attempt to break it.

Tests that need an isolation feature the host does not grant skip with the reason; on a Linux
host where the tests run as root (CI, this project's dev machines) every feature is present.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.tools.factory import make_sandbox
from agentrl.tools.sandbox import (
    ExecutionResult,
    LocalSandbox,
    SandboxUnavailableError,
    sandbox_environment,
)
from agentrl.tools.sandbox_isolation import interpreter_paths

OUTPUT_CAP = 4096


def sandbox_config(**overrides):
    settings = {
        "workers": 2,
        "timeout_s": 5,
        "memory_mb": 256,
        "max_processes": 16,
        "max_file_mb": 1,
        "max_output_bytes": OUTPUT_CAP,
        "preload_modules": ["json", "random"],  # the default adds numpy and sympy: slower to start
        **overrides,
    }
    return load_config({"sandbox": settings}).sandbox


def local_sandbox(namespaces: bool = True, **overrides) -> LocalSandbox:
    return LocalSandbox(sandbox_config(**overrides), namespaces=namespaces)


@pytest.fixture(scope="module")
def sandbox():
    with local_sandbox() as shared:
        yield shared


@pytest.fixture(scope="module")
def degraded_sandbox():
    """No namespaces: what a container without CAP_SYS_ADMIN gets."""
    with local_sandbox(namespaces=False) as degraded:
        yield degraded


def assert_still_works(sb):
    result = sb.run("print(6 * 7)")
    assert (result.status, result.stdout) == ("ok", "42\n"), f"the sandbox no longer runs code: {result}"


def host_processes_with_argument(argument: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argument.encode() in argv:
                found.append(int(entry))
    return found


def assert_only_zygotes_remain(sb):
    """Under each worker: its zygote and at most the child it forked ahead for the next request."""
    for worker in sb.worker_pids():
        remaining = descendants(worker)
        assert 1 <= len(remaining) <= 2, f"processes left under worker {worker}: {remaining}"


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, frontier = [], [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child)
    return found


# --------------------------------------------------------------------------- behaves like python
def test_runs_code_like_a_script(sandbox):
    ok = sandbox.run("import sys\nprint('hi')\nprint('warn', file=sys.stderr)")
    assert (ok.status, ok.stdout, ok.stderr, ok.exit_code, ok.truncated) == ("ok", "hi\n", "warn\n", 0, False)
    assert 0 < ok.duration_s < 5

    error = sandbox.run("x = 1\n1 / 0")
    assert (error.status, error.exit_code) == ("error", 1)
    assert error.stderr.startswith("Traceback (most recent call last):\n  File ")
    assert 'main.py", line 2, in <module>' in error.stderr
    assert error.stderr.endswith("ZeroDivisionError: division by zero\n")
    assert "sandbox" not in error.stderr, "the traceback must start at the user's code, as the interpreter's does"

    syntax = sandbox.run("def f(:\n    pass")
    assert syntax.status == "error" and "SyntaxError" in syntax.stderr and "Traceback" not in syntax.stderr

    exited = sandbox.run("import sys\nprint('before')\nsys.exit(3)")
    assert (exited.status, exited.exit_code, exited.stdout) == ("error", 3, "before\n")
    message = sandbox.run("raise SystemExit('bye')")
    assert (message.exit_code, message.stderr) == (1, "bye\n")


def test_stdin_is_passed(sandbox):
    echoed = sandbox.run("a = input()\nb = input()\nprint(int(a) + int(b))", stdin="2\n40\n")
    assert echoed.stdout == "42\n"
    big = "x" * 1_000_000
    length = sandbox.run("import sys\nprint(len(sys.stdin.read()))", stdin=big)
    assert length.stdout == f"{len(big)}\n", "stdin larger than a pipe buffer must arrive whole"
    no_stdin = sandbox.run("input()")
    assert no_stdin.status == "error" and "EOFError" in no_stdin.stderr
    unread = sandbox.run("print('did not read it')", stdin="x" * 2_000_000)
    assert (unread.status, unread.stdout) == ("ok", "did not read it\n"), "unread stdin must not block"


def test_each_execution_starts_fresh(sandbox):
    probe = (
        "import os, sys, random\n"
        "print(__name__, __file__ == sys.argv[0], os.getcwd() == os.path.dirname(__file__), sorted(os.listdir('.')))\n"
        "print(random.random())\n"
        "open('left-behind.txt', 'w').write('x')\n"
        "GLOBAL_STATE = 1"
    )
    first, second = sandbox.run(probe), sandbox.run(probe + "\nprint(globals().get('GLOBAL_STATE'))")
    assert first.status == second.status == "ok", (first, second)
    assert first.stdout.splitlines()[0] == "__main__ True True ['main.py']"
    assert second.stdout.splitlines()[0] == "__main__ True True ['main.py']", "the working directory must be fresh"
    assert first.stdout.splitlines()[1] != second.stdout.splitlines()[1], "each child must get its own random seed"
    if sandbox.isolation.private_tmp:
        tracebacks = [sandbox.run("1 / 0").stderr for _ in range(2)]
        assert tracebacks[0] == tracebacks[1] and '"/tmp/run/main.py"' in tracebacks[0], "output must be reproducible"


def test_threads_and_atexit_finish_like_at_interpreter_exit(sandbox):
    code = (
        "import atexit, threading, time\n"
        "atexit.register(lambda: print('atexit'))\n"
        "def late():\n    time.sleep(0.2)\n    print('thread')\n"
        "threading.Thread(target=late).start()\n"
        "print('main')"
    )
    assert sandbox.run(code).stdout == "main\nthread\natexit\n"


def test_preloaded_modules_are_imported_already():
    with local_sandbox(workers=1, preload_modules=["fractions", "no_such_module_xyz"]) as sb:
        assert sb.run("import sys\nprint('fractions' in sys.modules)").stdout == "True\n"
        assert sb.run("import no_such_module_xyz").status == "error"


def test_undecodable_output_is_replaced(sandbox):
    result = sandbox.run("import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe')")
    assert result.stdout == "ok \ufffd\ufffd"


def test_result_json_round_trip(sandbox):
    result = sandbox.run("print(1)")
    assert ExecutionResult.from_json(result.to_json()) == result
    assert set(result.to_json()) == {
        "status",
        "stdout",
        "stderr",
        "exit_code",
        "duration_s",
        "truncated",
        "infra_failure",
        "queue_s",
    }


def test_bad_requests_fail_clearly(sandbox):
    with pytest.raises(TypeError, match="code must be a str"):
        sandbox.run(b"print(1)")
    with pytest.raises(TypeError, match="stdin must be a str"):
        sandbox.run("print(1)", stdin=b"x")
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        sandbox.run("print(1)", timeout_s=0)
    with pytest.raises(TypeError, match="job 1 must be a"):
        sandbox.run_many([("print(1)", None), "print(2)"])


# --------------------------------------------------------------------------- limits
def test_infinite_loop_times_out(sandbox):
    started = time.monotonic()
    result = sandbox.run("while True:\n    pass", timeout_s=0.5)
    assert result.status == "timeout" and result.exit_code == -signal.SIGKILL
    assert 0.5 <= result.duration_s < 2 and time.monotonic() - started < 5
    assert_still_works(sandbox)


def test_cpu_time_limit_kills_a_busy_program():
    with local_sandbox(workers=1, cpu_time_s=1, timeout_s=30) as sb:
        result = sb.run("while True:\n    pass")
        assert result.status == "killed", result
        assert result.exit_code in (-signal.SIGXCPU, -signal.SIGKILL)
        assert result.duration_s < 20, "the CPU limit, not the 30 s wall clock, must have stopped it"
        assert_still_works(sb)


@pytest.mark.parametrize(
    "code", ["x = bytearray(4 * 1024 ** 3)", "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))"]
)
def test_memory_bomb_gets_memory_error(sandbox, code):
    result = sandbox.run(code)
    assert result.status == "error" and result.stderr.rstrip().endswith("MemoryError"), result
    assert_still_works(sandbox)


def test_fork_bomb_is_contained(sandbox):
    if not (sandbox.isolation.user_switch or sandbox.isolation.user_namespace):
        pytest.skip("the kernel enforces the process limit only for an unprivileged uid")
    stubborn = (
        "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)"
    )
    started = time.monotonic()
    result = sandbox.run(stubborn, timeout_s=1.5)
    assert result.status == "timeout" and time.monotonic() - started < 10, result
    assert_only_zygotes_remain(sandbox)
    classic = sandbox.run("import os\nwhile True:\n    os.fork()")
    assert classic.status == "error" and "BlockingIOError" in classic.stderr, "fork must fail at the process limit"
    assert_still_works(sandbox)


def test_huge_output_is_capped_without_blocking(sandbox):
    flood_code = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('e' * 65536)"
    flood = sandbox.run(flood_code, timeout_s=1)
    assert flood.status == "timeout" and flood.truncated
    assert flood.stdout == "x" * OUTPUT_CAP and flood.stderr == "e" * OUTPUT_CAP
    finite = sandbox.run(
        "import sys\nfor _ in range(200):\n    sys.stdout.write('y' * 500_000)\nprint('end', file=sys.stderr)"
    )
    assert (finite.status, finite.truncated, finite.stderr) == ("ok", True, "end\n"), "100 MB of output must not block"
    assert finite.stdout == "y" * OUTPUT_CAP
    assert_still_works(sandbox)


def test_file_size_limit(sandbox):
    result = sandbox.run("open('big.bin', 'wb').write(b'0' * (2 << 20))")  # max_file_mb = 1
    assert result.status == "error" and "File too large" in result.stderr, result
    assert sandbox.run("open('small.bin', 'wb').write(b'0' * 1000)").status == "ok"


# --------------------------------------------------------------------------- isolation
def test_writes_outside_the_working_directory_do_not_reach_the_host(sandbox):
    if not sandbox.isolation.readonly_root:
        pytest.skip("a read-only root needs a mount namespace and Linux >= 5.12")
    # A world-writable directory outside /tmp: only the read-only mount stands in the way.
    probe_dir = Path(tempfile.mkdtemp(prefix=".sandbox-write-probe-", dir=Path(__file__).parent))
    try:
        probe_dir.chmod(0o777)
        code = (
            "import os\n"
            f"for path in ['/etc/agentrl-probe', '{probe_dir}/escaped.txt', '/usr/agentrl-probe']:\n"
            "    try:\n        open(path, 'w').write('x')\n        print('WROTE', path)\n"
            "    except OSError as exc:\n        print('refused', exc.errno)\n"
            "open('/tmp/in-private-tmp.txt', 'w').write('x')\n"
            "print(sorted(os.listdir('/tmp')))"
        )
        result = sandbox.run(code)
        assert result.status == "ok" and "WROTE" not in result.stdout, result
        assert list(probe_dir.iterdir()) == [] and not Path("/etc/agentrl-probe").exists()
        assert not Path("/tmp/in-private-tmp.txt").exists(), "the code's /tmp must be private"
    finally:
        shutil.rmtree(probe_dir)
    later = sandbox.run("import os\nprint(sorted(os.listdir('/tmp')))")
    assert "in-private-tmp.txt" not in later.stdout, "the private /tmp must be emptied between executions"


def test_home_directories_are_hidden(sandbox):
    if not sandbox.isolation.private_root:
        pytest.skip("a private root needs a mount namespace")
    secret_dir = Path.home()
    visible_on_host = {p.name for p in secret_dir.iterdir()} if secret_dir.is_dir() else set()
    result = sandbox.run(f"import json, os\nprint(json.dumps(os.listdir({str(secret_dir)!r})))")
    listed = set(json.loads(result.stdout))
    kept_for_python = {
        Path(p).relative_to(secret_dir).parts[0] for p in interpreter_paths() if p.startswith(str(secret_dir) + "/")
    }
    assert listed <= kept_for_python, f"{secret_dir} shows {listed - kept_for_python} inside the sandbox"
    assert visible_on_host - kept_for_python, "nothing to hide on this host: the test would prove nothing"


READ_PROBE = """\
import sys
for path in sys.argv_paths:
    try:
        with open(path, 'rb') as fh:
            print('READ', path, fh.read()[:40])
    except OSError as exc:
        print('refused', path, exc.errno)
"""


def worker_python_paths() -> list[str]:
    """The Python directories a worker shows (computed as the worker does: ``python -I``)."""
    import agentrl

    root = str(Path(agentrl.__file__).resolve().parents[1])
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "from agentrl.tools.sandbox_worker import python_paths; del sys.path[0]; print(json.dumps(python_paths()))"
    )
    completed = subprocess.run([sys.executable, "-I", "-c", code, root], capture_output=True, text=True, check=True)
    return json.loads(completed.stdout)


def try_reading(sb, paths):
    result = sb.run(READ_PROBE.replace("sys.argv_paths", repr([str(p) for p in paths])))
    assert result.status == "ok", result
    return result.stdout


def test_files_outside_python_and_the_workdir_are_invisible(sandbox):
    """A root-only 0600 file outside /root, /home and /tmp, a results folder, the repository's data."""
    if not sandbox.isolation.private_root:
        pytest.skip("a private root needs a mount namespace")
    secret_dir = Path("/var/lib") / f"agentrl-probe-{uuid.uuid4().hex}"
    results_dir = Path(__file__).parent / f".sandbox-results-probe-{uuid.uuid4().hex}" / "results" / "rl"
    try:
        secret_dir.mkdir(parents=True)
        secret = secret_dir / "secret.txt"
        secret.write_text("root only")
        secret.chmod(0o600)
        results_dir.mkdir(parents=True)
        ground_truth = results_dir / "problems.jsonl"
        ground_truth.write_text('{"ground_truth": "42"}\n')
        ground_truth.chmod(0o644)
        fixtures = Path(__file__).parent / "fixtures" / "rl.jsonl"
        import agentrl

        paths = [secret, ground_truth, fixtures, Path(agentrl.__file__), Path(__file__)]
        assert all(p.is_file() for p in paths)
        output = try_reading(sandbox, paths)
        assert "READ" not in output, output
        assert output.count("refused") == len(paths)
        listing = json.loads(sandbox.run("import json, os\nprint(json.dumps(os.listdir('/')))").stdout)
        python_tops = {Path(p).parts[1] for p in worker_python_paths() if len(Path(p).parts) > 1}
        for host_only in ("work", "srv", "opt", "home", "mnt", "boot", "run"):
            if Path(f"/{host_only}").exists() and host_only not in python_tops:
                assert host_only not in listing, listing
    finally:
        shutil.rmtree(secret_dir, ignore_errors=True)
        shutil.rmtree(results_dir.parents[1], ignore_errors=True)


def test_the_code_has_no_capability(sandbox):
    """Nothing that bypasses file permissions (CAP_DAC_READ_SEARCH included), in any set."""
    if not sandbox.isolation.private_root:
        pytest.skip("without a private root the code may keep CAP_DAC_READ_SEARCH (see the module docstring)")
    result = sandbox.run("print(open('/proc/self/status').read())")
    sets = dict(line.split(":\t") for line in result.stdout.splitlines() if line.startswith("Cap"))
    assert {name: int(value, 16) for name, value in sets.items() if name != "CapBnd"} == {
        "CapInh": 0,
        "CapPrm": 0,
        "CapEff": 0,
        "CapAmb": 0,
    }, sets
    assert not sandbox.isolation.read_override


TMP_ENV_PROBE = """\
import json, sys
from agentrl.config import load_config
from agentrl.tools.sandbox import LocalSandbox
cfg = load_config({"sandbox": {"workers": 1, "preload_modules": [], "memory_mb": 512}}).sandbox
with LocalSandbox(cfg) as sb:
    code = "import numpy, sys\\nprint(numpy.__file__, sys.prefix, int(numpy.arange(4).sum()))\\n"
    write = f"open({sys.argv[1]!r} + '/probe.txt', 'w')"
    print(json.dumps([sb.run(code).to_json(), sb.run(code).to_json(), sb.run(write).to_json()]))
"""


def _link_or_copy(source: str, target: str) -> None:
    """A hard link (fast, and the file then lives in /tmp too), else a copy: hard links cannot
    cross file systems (EXDEV), and /tmp is often a tmpfs or another disk than the environment."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _link_or_copy_tree(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(str(source), str(target))


def test_a_python_environment_under_tmp_is_importable(tmp_path):
    """A venv in /tmp (node-local envs on clusters) whose numpy lives there too: read-only, importable."""
    if not (os.geteuid() == 0 or os.path.exists("/proc/sys/kernel/unprivileged_userns_clone")):
        pytest.skip("needs namespaces")
    import numpy

    root = Path(tempfile.mkdtemp(prefix="agentrl-tmp-env-", dir="/tmp"))
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(root / "venv")], check=True
        )
        site = next((root / "venv" / "lib").glob("python*/site-packages"))
        source = Path(numpy.__file__).parent
        for item in [source, *source.parent.glob("numpy.libs")]:
            _link_or_copy_tree(item, site / item.name)
        import agentrl

        env = {**os.environ, "PYTHONPATH": str(Path(agentrl.__file__).resolve().parents[1])}
        completed = subprocess.run(
            [str(root / "venv" / "bin" / "python"), "-c", TMP_ENV_PROBE, str(site / "numpy")],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert completed.returncode == 0, completed.stderr
        first, second, write = (ExecutionResult.from_json(r) for r in json.loads(completed.stdout.splitlines()[-1]))
        for result in (first, second):  # the second after the private /tmp was reset
            assert result.status == "ok", result
            numpy_file, prefix, total = result.stdout.split()
            assert numpy_file.startswith(str(site)) and prefix == str(root / "venv") and total == "6"
        assert write.status == "error" and "Read-only file system" in write.stderr, write
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_environment_of_the_caller_is_not_visible(sandbox, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "s3cret-" + uuid.uuid4().hex)
    host_pid = os.getpid()
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        f"for path in ['/proc/{host_pid}/environ', '/proc/{os.getppid()}/environ',\n"
        "             '/proc/1/environ', '/proc/self/environ']:\n"
        "    try:\n        print(open(path, 'rb').read().decode(errors='replace'))\n"
        "    except OSError as exc:\n        print('refused', path, exc.errno)\n"
    )
    result = sandbox.run(code)
    assert result.status == "ok", result
    expected_keys = sorted(set(sandbox_environment()) | {"HOME", "PWD"})
    assert result.stdout.splitlines()[0] == str(expected_keys)
    assert os.environ["AGENTRL_TEST_SECRET"] not in result.stdout
    # Every variable the test process started with and the sandbox does not set itself.
    started_with = Path(f"/proc/{host_pid}/environ").read_bytes().decode(errors="replace").split("\0")
    leaked = [
        entry
        for entry in started_with
        if "=" in entry and entry.split("=")[0] not in expected_keys and entry in result.stdout
    ]
    assert leaked == [], f"the caller's environment leaked into the sandbox: {leaked}"


def test_network_is_unreachable(sandbox):
    if not sandbox.isolation.network:
        pytest.skip("no network namespace on this host")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"for address in [('127.0.0.1', {port}), ('10.255.255.1', 80), ('1.1.1.1', 53)]:\n"
            "    try:\n        socket.create_connection(address, timeout=1)\n        print('CONNECTED', address)\n"
            "    except OSError as exc:\n        print('refused', exc)\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); print('loopback inside works')"
        )
        result = sandbox.run(code)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # a connection from the sandbox would be waiting in the backlog
    assert result.status == "ok" and "CONNECTED" not in result.stdout, result
    assert "loopback inside works" in result.stdout


def test_network_isolation_policy(caplog):
    with pytest.raises(SandboxUnavailableError, match="'required'"):
        local_sandbox(namespaces=False, workers=1, network_isolation="required")
    with caplog.at_level(logging.WARNING, logger="agentrl.tools.sandbox"):
        with local_sandbox(namespaces=False, workers=2, network_isolation="best_effort") as sb:
            assert_still_works(sb)
            assert_still_works(sb)
    warnings = [r for r in caplog.records if "network isolation is unavailable" in r.getMessage()]
    assert len(warnings) == 1, "best_effort must say once that network isolation is unavailable"


@pytest.mark.parametrize("mode", ["namespaces", "degraded"])
def test_code_cannot_kill_the_caller(mode, sandbox, degraded_sandbox):
    sb = sandbox if mode == "namespaces" else degraded_sandbox
    host_pid, host_group = os.getpid(), os.getpgid(0)
    visible = sb.run(
        f"import os\ntry:\n    os.kill({host_pid}, 0)\n    print('signalable')\n"
        "except OSError as exc:\n    print(type(exc).__name__)"
    )
    if visible.stdout == "signalable\n":
        if sb.isolation.pid_namespace or sb.isolation.user_switch:
            pytest.fail("the code can signal the calling process despite PID namespace / uid isolation")
        pytest.skip("neither a PID namespace nor a separate uid: the caller is reachable (documented)")
    workers_before = sorted(sb.worker_pids())
    attacks = (
        "import os, signal\n"
        f"for name, attack in [('parent', lambda: os.kill(os.getppid(), signal.SIGKILL)),\n"
        f"                     ('caller', lambda: os.kill({host_pid}, signal.SIGKILL)),\n"
        f"                     ('caller group', lambda: os.killpg({host_group}, signal.SIGKILL)),\n"
        "                     ('init', lambda: os.kill(1, signal.SIGKILL)),\n"
        "                     ('everyone', lambda: os.kill(-1, signal.SIGKILL))]:\n"
        "    try:\n        attack()\n        print(name, 'sent', flush=True)\n"
        "    except OSError as exc:\n        print(name, type(exc).__name__, flush=True)\n"
        "os.killpg(0, signal.SIGKILL)  # finally its own group: itself\n"
    )
    result = sb.run(attacks)
    assert result.status == "killed" and result.exit_code == -signal.SIGKILL, result
    assert result.stdout.count("\n") == 5, f"every attack must have been attempted: {result.stdout!r}"
    assert os.getpid() == host_pid  # still here
    assert sorted(sb.worker_pids()) == workers_before, "the workers must survive the code's attacks"
    assert_still_works(sb)


@pytest.mark.parametrize("mode", ["namespaces", "degraded"])
def test_no_process_survives_the_execution(mode, sandbox, degraded_sandbox):
    sb = sandbox if mode == "namespaces" else degraded_sandbox
    detached, daemon = (f"{time.time() % 1000:.6f}{suffix}" for suffix in ("1", "2"))
    code = (
        "import os, subprocess, time\n"
        f"subprocess.Popen(['sleep', '{detached}'], start_new_session=True)\n"
        "if os.fork() == 0:  # the classic double-fork daemon\n"
        "    os.setsid()\n"
        f"    if os.fork() == 0:\n        os.execvp('sleep', ['sleep', '{daemon}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        "def running(marker):\n"
        "    return sum(marker.encode() in open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
        "               for p in os.listdir('/proc') if p.isdigit() and os.path.exists(f'/proc/{p}/cmdline'))\n"
        f"print(running('{detached}'), running('{daemon}'))"
    )
    result = sb.run(code)
    assert (result.status, result.stdout) == ("ok", "1 1\n"), f"both children must have been running: {result}"
    assert host_processes_with_argument(detached) == [], "a child in its own session survived the execution"
    assert host_processes_with_argument(daemon) == [], "a double-forked daemon survived the execution"
    assert_only_zygotes_remain(sb)
    assert_still_works(sb)


# --------------------------------------------------------------------------- pool
def test_run_many_is_concurrent_and_keeps_order(sandbox):
    jobs = [(f"import time\ntime.sleep(0.4)\nprint({i})", None) for i in range(6)]
    started = time.monotonic()
    results = sandbox.run_many(jobs)
    elapsed = time.monotonic() - started
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
    assert elapsed < 0.8 * 6 * 0.4, f"2 workers must overlap 6 sleeps of 0.4 s, took {elapsed:.2f} s"


def test_run_is_thread_safe(sandbox):
    outputs: dict[int, str] = {}

    def call(i):
        outputs[i] = sandbox.run(f"print({i} * 2)", stdin=str(i)).stdout

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outputs == {i: f"{i * 2}\n" for i in range(8)}


def test_a_dead_worker_is_replaced():
    with local_sandbox(workers=1) as sb:
        os.kill(sb.worker_pids()[0], signal.SIGKILL)
        time.sleep(0.1)
        assert_still_works(sb)  # found dead before the job: replaced transparently
        victim = sb.worker_pids()[0]
        threading.Timer(0.5, os.kill, (victim, signal.SIGKILL)).start()
        lost = sb.run("import time\ntime.sleep(10)")
        assert (lost.status, lost.exit_code) == ("killed", None) and "worker" in lost.stderr, lost
        assert_still_works(sb)
        assert sb.worker_pids() != [victim]


def test_close_stops_the_workers():
    sb = local_sandbox(workers=2)
    pids = sb.worker_pids()
    sb.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
        time.sleep(0.05)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids), "closing must end every worker"
    with pytest.raises(RuntimeError, match="closed"):
        sb.run("print(1)")


def test_close_with_executions_in_flight_still_returns_results():
    sb = local_sandbox(workers=2)
    results = []
    runners = [threading.Thread(target=lambda: results.append(sb.run("import time\ntime.sleep(30)"))) for _ in range(2)]
    for runner in runners:
        runner.start()
    time.sleep(0.5)
    started = time.monotonic()
    sb.close()
    for runner in runners:
        runner.join(timeout=20)
    assert len(results) == 2 and time.monotonic() - started < 15, "close must not wait for the code's timeout"
    assert all(r.status == "killed" and r.exit_code is None for r in results), results


def test_make_sandbox_picks_the_backend():
    cfg = sandbox_config(workers=1)
    with make_sandbox(cfg) as sb:
        assert isinstance(sb, LocalSandbox)
    with pytest.raises(ValueError, match="sandbox.backend"):
        make_sandbox(dataclasses.replace(cfg, backend="docker"))


# --------------------------------------------------------------------------- CLI
SMALL_CONFIG = '{"sandbox": {"timeout_s": 5}}'


def test_cli_prints_the_result_as_json(tmp_path, capsys):
    from agentrl.tools.cli import main

    program = tmp_path / "reverse.py"
    program.write_text("import sys\nprint(sys.stdin.read()[::-1])")
    stdin = tmp_path / "input.txt"
    stdin.write_text("abc")
    assert main(["--config-json", SMALL_CONFIG, "--stdin", str(stdin), str(program)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["status"] == "ok" and printed["stdout"] == "cba\n"

    assert main(["--config-json", SMALL_CONFIG, "--timeout", "0.3", str(tmp_path / "loop.py")]) == 2
    assert "cannot read the program" in capsys.readouterr().err
    (tmp_path / "loop.py").write_text("while True:\n    pass")
    assert main(["--config-json", SMALL_CONFIG, "--timeout", "0.3", str(tmp_path / "loop.py")]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "timeout"


def test_cli_reads_the_program_from_stdin_and_applies_the_memory_limit(monkeypatch, capsys):
    from agentrl.tools.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO("x = bytearray(200 * 1024 * 1024)\nprint('allocated')"))
    assert main(["--config-json", SMALL_CONFIG, "--memory-mb", "64", "-"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["status"] == "error" and "MemoryError" in printed["stderr"]


def test_cli_rejects_bad_configuration(tmp_path, capsys):
    from agentrl.tools.cli import main

    program = tmp_path / "p.py"
    program.write_text("print(1)")
    assert main(["--config-json", '{"sandbox": {"timeout": 3}}', str(program)]) == 2
    assert "unknown key(s) ['timeout'] under 'sandbox'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--timeout", "-1", str(program)])


def test_python_dash_m_agentrl_sandbox(tmp_path):
    program = tmp_path / "p.py"
    program.write_text("print(2 ** 10)")
    completed = subprocess.run(
        [sys.executable, "-m", "agentrl", "sandbox", "--config-json", SMALL_CONFIG, str(program)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["stdout"] == "1024\n"
