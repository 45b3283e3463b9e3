"""Benchmark evaluation of one model (docs/recipe.md section 7), on the sampling service of
:mod:`agentrl.sampling` (rollouts, shard files, samples and their metrics):

- ``livecodebench``: code samples in LiveCodeBench's custom-evaluator format;
- ``cli``: ``python -m agentrl evaluate run | shard | gather | export-livecodebench``.
"""
