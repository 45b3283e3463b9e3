"""Supervised fine-tuning on multi-turn tool-use trajectories (docs/recipe.md section 5), on DeepSpeed.

- ``masking``: a conversation rendered with the chat template, and the tokens SFT trains on;
- ``batching``: tokenized conversations, the data order, token-budget micro-batches;
- ``trainer``: the loop (loss over the trained tokens of a whole step, checkpoints, resume);
- ``cli``: ``python -m agentrl sft``. What SFT shares with GRPO is in :mod:`agentrl.training`.
"""
