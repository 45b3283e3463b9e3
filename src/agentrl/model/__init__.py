"""The base model and model folders.

- ``build``: the embedded default's tiny Qwen3 and its tokenizer, or a hub id / local folder;
- ``folder``: model folders as Snakemake tracks them (a digest of the model's files in ``config.json``);
- ``cli``: ``python -m agentrl base-model``; ``fetch``: ``python -m agentrl fetch-model``.
"""
