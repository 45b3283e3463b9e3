"""Model-aware RL data filtering (docs/recipe.md section 6): the SFT model's pass rates pick the RL set.

- ``pass_rates``: the pass-rate table of the RL pool (k graded rollouts per problem);
- ``selection``: the pass-rate band and histogram matching that select the training set;
- ``histogram``: the pass-rate histogram plot;
- ``cli``: ``python -m agentrl filter score | select``.
"""
