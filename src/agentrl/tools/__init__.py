"""agentrl.tools: the code sandbox and the code_interpreter tool built on it.

``sandbox`` (the interface and the local backend), ``sandbox_fusion`` (the upstream HTTP service
as a second backend), ``factory`` (``make_sandbox``: the backend the config names),
``code_interpreter`` (the recipe's tool), ``health`` (the tool-call classes and their shares),
``cli`` (``python -m agentrl sandbox``); ``sandbox_worker``, ``sandbox_capture``,
``sandbox_child`` and ``sandbox_isolation`` are the local backend's worker process.
"""
