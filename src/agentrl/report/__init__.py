"""The run's report: the summary table, the plots and the ablation tables.

- ``tables``: models x benchmarks x metrics, with the published figures beside ours;
- ``plots``: accuracy by model stage, reasoning modes, training curves;
- ``ablations``: the paper's three ablation questions (data, algorithm, reasoning mode);
- ``cli``: ``python -m agentrl report``.
"""
