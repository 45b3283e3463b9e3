"""Training infrastructure shared by the SFT and GRPO stages (DeepSpeed engine, checkpoints)."""
