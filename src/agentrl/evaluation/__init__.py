"""Benchmark evaluation of one model (docs/recipe.md section 7).

- ``sampling``: graded agentic rollouts of a model on a problem set (shared with filter scoring);
- ``samples``: the per-sample records of ``samples.jsonl``; ``metrics``: avg@n, pass@k, maj@k,
  confidence intervals and tool-use figures from them;
- ``livecodebench``: code samples in LiveCodeBench's custom-evaluator format;
- ``cli``: ``python -m agentrl evaluate run | export-livecodebench``.
"""
