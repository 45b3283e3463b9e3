"""Fixtures the test modules share; pytest finds them here. Shared functions and constants live
in the tests/helpers package (``from helpers.rollout import random_policy``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def launcher_variables_stay_in_their_test():
    """A test that runs a trainer in the pytest process sets the launcher variables of its
    one-process group (agentrl.training.deepspeed_engine); left in os.environ they would reach
    every stage a later test starts as a subprocess, which would then take itself for a torchrun
    rank. They are put back as they were after each test (init_distributed sets them again for a
    group that is still up)."""
    import os

    from agentrl.training.deepspeed_engine import LAUNCHER_VARIABLES

    before = {key: os.environ.get(key) for key in LAUNCHER_VARIABLES}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


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
    from agentrl.tools.factory import make_sandbox

    cfg = load_config({"sandbox": {"workers": 2}})
    with make_sandbox(cfg.sandbox) as sandbox:
        yield CodeInterpreter(sandbox, cfg.tool)


@pytest.fixture(scope="module")
def interpreter_and_sandbox():
    """(the :func:`interpreter` tool, its sandbox), for tests that also run code on the sandbox directly."""
    from agentrl.config import load_config
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.factory import make_sandbox

    cfg = load_config({"sandbox": {"workers": 2}})
    with make_sandbox(cfg.sandbox) as sandbox:
        yield CodeInterpreter(sandbox, cfg.tool), sandbox


@pytest.fixture(scope="module")
def tiny_sft_workspace(tmp_path_factory):
    """A folder with 24 tool-use conversations (sft.parquet) and a tiny base model trained on them
    (base/), built once per module (helpers.sft_runs.sft_workspace)."""
    from helpers.sft_runs import sft_workspace

    return sft_workspace(tmp_path_factory.mktemp("sft"))


@pytest.fixture(scope="module")
def random_policy_dir():
    """The folder of helpers.rollout's random tiny policy (built once per session)."""
    from pathlib import Path

    from helpers.rollout import random_policy

    return Path(random_policy())


@pytest.fixture(scope="module")
def pool_scored_in_one_job(random_policy_dir, tmp_path_factory):
    """9 problems scored as one shard: (pool path, the shard file, gathered pass rates and samples)."""
    from helpers.shard_runs import scored_in_one_job

    return scored_in_one_job(random_policy_dir, tmp_path_factory.mktemp("one"))
