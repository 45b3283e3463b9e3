"""What the SFT and GRPO stages share: the toolkit of a training stage.

- ``loop``: the loop both stages run their steps in (metrics, step boundary, checkpoints, stop);
- ``deepspeed_engine``: process group, DeepSpeed engine, checkpoints, the final Hugging Face folder;
- ``model``: the model a stage trains (``load_causal_lm``);
- ``fingerprint``: what a checkpoint must share with a run to be resumed (``fingerprint_of``);
- ``metrics``: the per-step metrics file and its resume rule (``MetricsWriter``, ``read_metrics``);
- ``seeds`` and ``threads``: derived seeds, the CPU threads of a process.
"""
