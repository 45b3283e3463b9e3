"""LoRA adapters for the training stages (``sft.lora``, ``grpo.lora``), on PEFT.

With a stage's ``lora.enabled`` its model is PEFT's ``PeftModel`` around the Hugging Face model
(:func:`add_adapters`, called by :func:`agentrl.training.model.load_causal_lm`): every target
layer computes ``W x + (alpha / r) B A x`` with ``W`` frozen, ``A`` random and ``B`` zero, so
training starts at the model it loaded and only the adapters require gradients (DeepSpeed's
optimizer takes the trainable parameters alone, :func:`agentrl.training.deepspeed_engine.build_engine`).
The stage's loop, step and losses are the full fine-tuning ones: the ``PeftModel`` forwards
``config``, ``get_decoder`` and ``get_output_embeddings`` to the model inside it, which is all
the stages' forwards call.

What else LoRA changes, each in one place:

- the target modules are checked against the model folder before its weights load
  (:func:`check_target_modules`: the model built from ``config.json`` on the meta device);
- the weights other code reads are the merged ones (:class:`MergedWeights`: ``W + delta`` of
  each adapted layer, by PEFT's ``get_delta_weight``, one layer at a time and never written
  into the module): the final Hugging Face folder (evaluation needs nothing new) and every
  policy version a vLLM engine loads (:func:`hf_weights`, :class:`MergedWeightSource`);
- the adapter is written beside the merged weights, in the model folder's ``adapter/``
  (:data:`ADAPTER_FOLDER`, PEFT's own format): the rules' outputs are unchanged (the folder
  their ``config.json`` marks holds both) and the folder's tmp-then-rename write covers both;
- checkpoints leave the frozen weights out (they are the model folder's, whose files are in the
  run fingerprint) and hold the adapter and its optimizer state
  (:func:`agentrl.training.deepspeed_engine.save_checkpoint`; DeepSpeed drops frozen parameters
  by their first name, so a tied output head, an alias of the embedding, stays in);
- GRPO's reference policy is the same module with the adapter off
  (:class:`agentrl.grpo.policy.AdapterDisabled`), no second model;
- ``lora.modules_to_save`` modules (PEFT's) train whole beside the adapters: PEFT wraps each in a
  trained copy and keeps the original, which the adapter-off forward uses; a tied output head
  follows a trained embedding (PEFT's ``ensure_weight_tying``), and the merged weights read the
  copy under the module's own name.

Departure from PEFT's defaults: ``A`` is drawn from a generator seeded by the run's seed, so
every rank starts from the same adapter and the trainer's own random stream is untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agentrl.config import ConfigError, LoraConfig
from agentrl.rollout.weight_transfer import ParamSpec
from agentrl.training.hf_export import distinct_tensors, save_hf_folder

if TYPE_CHECKING:
    from peft import PeftModel

ALL_LINEAR = "all-linear"  # PEFT's name for every linear layer but the output head
ADAPTER_FOLDER = "adapter"  # the adapter's folder inside an exported model folder


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries PEFT adapters (the stage's ``lora.enabled``)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def _meta_model(model_dir: str | Path) -> torch.nn.Module:
    """The model in ``model_dir`` built from its ``config.json`` on the meta device: its modules'
    names and types, no weight read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def linear_layer_names(model_dir: str | Path) -> list[str]:
    """The names (last component, as ``q_proj``) of the linear layers of the model in ``model_dir``
    but its output head: what ``target_modules`` may name (:func:`_meta_model`)."""
    model = _meta_model(model_dir)
    head = model.get_output_embeddings()
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and m is not head
        }
    )


def module_names(model_dir: str | Path) -> list[str]:
    """The names (last component, as ``embed_tokens``) of every module of the model in
    ``model_dir`` with weights of its own: what ``modules_to_save`` may name (:func:`_meta_model`)."""
    model = _meta_model(model_dir)
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in model.named_modules()
            if name and next(m.parameters(recurse=False), None) is not None
        }
    )


def check_target_modules(model_dir: str | Path, lora: LoraConfig, key: str) -> None:
    """Refuse (ConfigError) a ``target_modules`` entry that is not a linear layer of the model in
    ``model_dir``, or a ``modules_to_save`` entry that is none of its modules with weights, naming
    the entry and what the model has; ``key`` is the config section (``sft.lora``, ``grpo.lora``)."""
    if not lora.enabled:
        return
    if tuple(lora.target_modules) != (ALL_LINEAR,):
        names = linear_layer_names(model_dir)
        missing = [m for m in lora.target_modules if m not in names]
        if missing:
            raise ConfigError(
                f"{key}.target_modules: {', '.join(missing)} is not a linear layer of {model_dir}; its linear "
                f"layers (but the output head) are {', '.join(names)}, or give {ALL_LINEAR}"
            )
    if lora.modules_to_save:
        names = module_names(model_dir)
        missing = [m for m in lora.modules_to_save if m not in names]
        if missing:
            raise ConfigError(
                f"{key}.modules_to_save: {', '.join(missing)} is no module of {model_dir} with weights; its "
                f"modules are {', '.join(names)}"
            )


def add_adapters(model: torch.nn.Module, lora: LoraConfig, seed: int) -> PeftModel:
    """``model`` with PEFT's LoRA layers on ``lora.target_modules``; only the adapters train.

    The adapters' initial ``A`` comes from ``seed`` (``B`` is zero): the same on every rank and
    in a resumed run, and the caller's random stream is left as it was.
    """
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = ALL_LINEAR if tuple(lora.target_modules) == (ALL_LINEAR,) else list(lora.target_modules)
    settings = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        modules_to_save=list(lora.modules_to_save) or None,
        # a trained embedding stays the output head of a tied model (else the head would be the
        # frozen original, and the tokens it must learn to emit would stay out of reach)
        ensure_weight_tying=bool(lora.modules_to_save),
    )
    devices = [model.device.index or 0] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return get_peft_model(model, settings)


class MergedWeights(Mapping[str, torch.Tensor]):
    """A LoRA model's weights by their Hugging Face names, each adapted layer's merged on access.

    ``W + sum_a delta_a`` (PEFT's ``get_delta_weight``, as its ``merge`` computes it, in the
    weight's dtype) is computed when the name is read and nothing is written into the module, so
    the trained adapter stays apart and at most one merged tensor exists at a time (a writer or a
    sender that drops it before reading the next). Other weights are the module's own tensors.
    The names are the model's own ``state_dict`` names without PEFT's ``base_layer`` and adapter
    entries, tied aliases left out as :func:`~agentrl.training.hf_export.distinct_tensors` does.
    A module trained whole (``lora.modules_to_save``) is read as its forward uses it: the trained
    copy, or the original with the adapter off.
    """

    def __init__(self, model: PeftModel) -> None:
        from peft.tuners.lora import LoraLayer
        from peft.utils.other import ModulesToSaveWrapper

        self.model = model
        base = model.get_base_model()
        layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
        wrappers = {name: m for name, m in base.named_modules() if isinstance(m, ModulesToSaveWrapper)}
        self._sources: dict[str, torch.Tensor | LoraLayer | tuple[ModulesToSaveWrapper, str]] = {}
        for name, tensor in distinct_tensors(base).items():
            parts = name.split(".")
            if any(part.startswith("lora_") for part in parts) or "modules_to_save" in parts:
                continue  # an adapter, or the trained copy of a module (read through its wrapper below)
            plain = name.replace(".base_layer.", ".")
            if ".original_module." in plain:
                wrapper, _, leaf = plain.partition(".original_module.")
                self._sources[f"{wrapper}.{leaf}"] = (wrappers[wrapper], leaf)
                continue
            module, _, leaf = plain.rpartition(".")
            self._sources[plain] = layers[module] if module in layers and leaf == "weight" else tensor

    def __len__(self) -> int:
        return len(self._sources)

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    @torch.no_grad()
    def __getitem__(self, name: str) -> torch.Tensor:
        source = self._sources[name]
        if isinstance(source, torch.Tensor):
            return source.detach()
        if isinstance(source, tuple):
            return _saved_module_weight(*source).detach()
        assert not source.merged, f"{name}: the adapter was merged into the module; MergedWeights merges on access"
        weight = source.get_base_layer().weight.detach()
        if source.disable_adapters:
            return weight
        for adapter in source.active_adapters:
            if adapter in source.lora_A:
                weight = weight + source.get_delta_weight(adapter).to(weight.dtype)
        return weight

    def specs(self) -> list[ParamSpec]:
        """Each name's dtype and shape, nothing merged (a receiver allocates by them)."""
        specs = []
        for name, source in self._sources.items():
            if isinstance(source, torch.Tensor):
                tensor = source
            elif isinstance(source, tuple):
                tensor = _saved_module_weight(*source)
            else:
                tensor = source.get_base_layer().weight
            specs.append(ParamSpec(name, tensor.dtype, tuple(tensor.shape)))
        return specs


def _saved_module_weight(wrapper, leaf: str) -> torch.Tensor:
    """The weight ``leaf`` of a module trained whole, as PEFT's wrapper forwards: the original with
    the adapter off (or no active adapter of its own), else the active adapter's trained copy."""
    active = wrapper.active_adapters
    if wrapper.disable_adapters or not active or any(a not in wrapper.modules_to_save for a in active):
        return wrapper.original_module.get_parameter(leaf)
    return wrapper.modules_to_save[active[0]].get_parameter(leaf)


def hf_weights(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """``(Hugging Face name, tensor)`` of every weight: ``named_parameters`` of a plain model, the
    merged weights of a LoRA one (one merged tensor at a time)."""
    return MergedWeights(model).items() if is_lora(model) else model.named_parameters()


class MergedWeightSource:
    """A LoRA policy as the weight source of vLLM's weight-transfer protocol
    (:class:`agentrl.rollout.weight_transfer.WeightSource`): the merged weights, each computed when
    the sender reaches it. Not under ZeRO-3 (refused at load), so no rank gathers anything."""

    def __init__(self, model: PeftModel) -> None:
        self.model = model

    def metadata(self) -> list[ParamSpec]:
        return MergedWeights(self.model).specs()

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(MergedWeights(self.model).items())


def save_merged_folder(model: PeftModel, tokenizer, folder: str | Path) -> None:
    """The LoRA ``model`` as a Hugging Face folder of merged weights (what full fine-tuning writes:
    :func:`~agentrl.training.hf_export.save_hf_folder`), the adapter in its ``adapter/`` folder."""
    folder = Path(folder)
    save_hf_folder(model.get_base_model(), tokenizer, folder, tensors=MergedWeights(model))
    save_adapter(model, folder / ADAPTER_FOLDER)


def save_adapter(model: PeftModel, folder: str | Path) -> None:
    """PEFT's adapter folder (``adapter_config.json``, ``adapter_model.safetensors``): the adapter
    alone, loadable onto the model it was trained from (``PeftModel.from_pretrained``)."""
    model.save_pretrained(str(folder), save_embedding_layers=False)
