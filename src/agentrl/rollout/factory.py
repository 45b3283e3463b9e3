"""Building the engine a config names: the one place that knows the backends (``hf``, ``vllm``).

The interface (:mod:`agentrl.rollout.engine`) knows none of them, and each backend imports only
the interface, so the arrows point from here down to both; a backend is imported only when
chosen (vLLM is an optional dependency).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentrl.errors import ModelFolderError
from agentrl.model.tokenizer import end_of_sequence_ids, load_chat_tokenizer, pad_token_id
from agentrl.precision import resolve_dtype
from agentrl.rollout.engine import Engine, default_device

if TYPE_CHECKING:
    from agentrl.config import RolloutConfig
    from agentrl.rollout.memory_plan import TrainerMemory


def load_policy(model_dir: str, *, dtype: str = "auto", device: str | None = None):
    """Load a Hugging Face causal LM folder and its tokenizer, in eval mode, for generation.

    Returns ``(model, tokenizer)``. The tokenizer must carry a chat template (the agent loop
    renders prompts and tool turns with it).
    """
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    if not (Path(model_dir) / "config.json").exists():
        raise ModelFolderError(f"{model_dir}: not a Hugging Face model folder (no config.json)")
    device = device or default_device()
    tokenizer = load_chat_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=resolve_dtype(dtype, device))
    model.to(device).eval()
    return model, tokenizer


def make_engine(
    cfg: RolloutConfig,
    model_dir: str,
    *,
    model=None,
    tokenizer=None,
    colocated: bool = False,
    in_process: bool | None = None,
    seed: int = 0,
    trainer_memory: TrainerMemory | None = None,
    weight_transfer: str | None = None,
) -> Engine:
    """The engine named by ``cfg.engine``.

    ``hf`` generates with ``model`` when given (the trainer's own in-memory module: then weight
    updates are free) or loads ``model_dir``. ``vllm`` always loads ``model_dir`` into a
    ``vllm.LLM``; the trainer pushes new weights with ``update_weights``. ``colocated``: the
    engine of one trainer rank (GRPO: vLLM's external launcher on the rank's own device, see
    :mod:`agentrl.rollout.vllm_engine`). ``in_process`` (vLLM; default: ``colocated``): the engine
    core in this process, which ``update_weights`` needs (it hands tensors over by reference), or
    where a weight-transfer backend registered in this process must reach vLLM's worker (GRPO's
    rollout process on CPU, :mod:`agentrl.grpo.rollout_process`); the hf engine always runs in this
    process. ``seed`` its
    default seed (requests carry their own), ``trainer_memory`` what the trainer beside it still
    needs (``rollout.vllm.colocated_memory: measured``; engines that share the trainer's module
    need none). ``weight_transfer`` (vLLM): the backend of vLLM's weight-transfer API it answers
    on (:meth:`~agentrl.rollout.engine.Engine.weight_sync`; :mod:`agentrl.rollout.weight_transfer`);
    the hf engine answers on the gloo backend without it.
    """
    if cfg.engine == "hf":
        from agentrl.rollout.hf_engine import HFEngine

        if model is None:
            model, tokenizer = load_policy(model_dir, dtype=cfg.dtype)
        elif tokenizer is None:
            tokenizer = load_chat_tokenizer(model_dir)
        return HFEngine(
            model,
            pad_token_id=pad_token_id(tokenizer),
            batch_size=cfg.batch_size,
            eos_token_ids=end_of_sequence_ids(model, tokenizer),
        )
    if cfg.engine == "vllm":
        from agentrl.rollout.vllm_engine import VllmEngine

        return VllmEngine(
            model_dir,
            cfg,
            seed=seed,
            colocated=colocated,
            trainer_memory=trainer_memory,
            in_process=in_process,
            weight_transfer=weight_transfer,
        )
    raise ValueError(f"rollout.engine = {cfg.engine!r} is not known; choose one of: hf, vllm")
