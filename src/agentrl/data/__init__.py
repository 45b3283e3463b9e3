"""The data of every stage, as normalized records (docs/recipe.md section 1).

- ``records``: the one schema every source is normalized into (problems, SFT conversations, trajectories);
- ``embedded``: the embedded default's three task families; ``stitched``: the data ablation's stitched SFT;
- ``reasoning_modes``: the reasoning ablation's deliberative and reactive SFT trajectories;
- ``upstream``: loaders for the paper's released data; ``prompts``: the recipe's prompt templates;
- ``prompt_fit``: prompts over the token limits dropped before any rollout;
- ``cli``: ``python -m agentrl prepare-data``.
"""
