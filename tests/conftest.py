"""Fixtures the test modules share; pytest finds them here. Shared functions and constants live
in the tests/helpers package (``from helpers.rollout import random_policy``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def one_thread():
    """One torch intra-op thread for a module's tests, the previous count restored after them.

    Tiny matmuls on a shared 2-core machine: intra-op threads only add barrier waits. Modules opt
    in with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def interpreter():
    """The code-interpreter tool (default ``tool`` settings) over a local sandbox of 2 workers."""
    from agentrl.config import load_config
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.sandbox import make_sandbox

    cfg = load_config({"sandbox": {"workers": 2}})
    with make_sandbox(cfg.sandbox) as sandbox:
        yield CodeInterpreter(sandbox, cfg.tool)


@pytest.fixture(scope="module")
def interpreter_and_sandbox():
    """(the :func:`interpreter` tool, its sandbox), for tests that also run code on the sandbox directly."""
    from agentrl.config import load_config
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.sandbox import make_sandbox

    cfg = load_config({"sandbox": {"workers": 2}})
    with make_sandbox(cfg.sandbox) as sandbox:
        yield CodeInterpreter(sandbox, cfg.tool), sandbox
