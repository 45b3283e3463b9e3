"""GRPO-TCR training of the SFT model with agentic rollouts (docs/recipe.md section 5).

- ``algorithm``: the algorithm as pure tensor functions (advantages, clipped loss, aggregation, KL);
- ``variants``: the paper's variants (GRPO, GRPO-T, GRPO-SCR, GRPO-TCR) as named settings;
- ``batching`` / ``policy``: trajectories to padded micro-batches, the actor's response log-probs;
- ``step``: one step (rollout, reward, advantages, recomputation, DeepSpeed update, weight push);
- ``prompts``, ``validation``, ``metrics``, ``checkpoint``, ``distributed``: what a step needs around it;
- ``trainer``: the stage from files to files, its steps in :class:`agentrl.training.loop.TrainingLoop`
  (resume, validate, checkpoint, export); ``cli``: ``python -m agentrl grpo``.
"""
