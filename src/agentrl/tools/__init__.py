"""agentrl.tools: the code sandbox and the code_interpreter tool built on it.

``sandbox`` (the interface, the local backend and ``make_sandbox``), ``sandbox_fusion`` (the
upstream HTTP service as a second backend), ``code_interpreter`` (the recipe's tool), ``cli``
(``python -m agentrl sandbox``); ``sandbox_worker``, ``sandbox_capture``, ``sandbox_child``
and ``sandbox_isolation`` are the local backend's worker process.
"""
