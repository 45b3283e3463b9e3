"""agentrl: the agentic RL recipe of "Demystifying Reinforcement Learning in Agentic Reasoning".

Every stage is a small CLI, ``python -m agentrl <stage> ...``, with explicit paths; the
Snakemake workflow (``workflow/Snakefile``) only wires them together.
"""

__version__ = "0.1.0"
