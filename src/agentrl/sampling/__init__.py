"""Graded agentic rollouts of one model on a problem set: the sampling service that the filtering
stage's scoring (docs/recipe.md section 6) and the benchmark evaluation (section 7) both run, so a
pass rate measured for filtering means what a reward means during RL.

- ``rollouts``: n graded multi-turn rollouts per problem (:func:`grade_problems`, :class:`SamplingSetup`);
- ``shards``: resumable shard files of a scattered scoring or evaluation job, their lock, their
  stop on a signal or an orphaning, and the gather;
- ``samples``: the per-sample records of ``samples.jsonl``;
- ``metrics``: avg@n, pass@k, maj@k, confidence intervals and tool-use figures from the samples.
"""
