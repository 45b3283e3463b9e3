"""A trained module as a Hugging Face folder, its weights written one tensor at a time.

transformers' ``save_pretrained`` refuses to hand safetensors two tensors on one storage and
clones every tensor that shares one (``remove_tied_weights_from_state_dict``). Under ZeRO-2
every parameter is a view of one flat buffer (DeepSpeed's ``_update_model_bit16_weights``), so
it clones the whole model at once, on the GPU when the model lives there: ~8 GB for a 4B model
in bf16 while a colocated rollout engine holds the rest of the card. :func:`write_safetensors`
writes the same file with no clone: each tensor goes to the file from where it is (a CPU tensor
straight from its storage, a GPU tensor through one host copy of itself), so the export needs
no extra GPU memory and at most one tensor of host memory.

The folder is what ``save_pretrained`` writes for a model without remote code or adapters
(``config.json`` with its ``dtype`` and ``architectures``, ``generation_config.json``, one
``model.safetensors`` with tied aliases left out, their first name kept), plus the tokenizer
and the model digest (:func:`agentrl.model.folder.stamp_model_digest`);
tests/test_hf_export.py checks it against ``save_pretrained``'s.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import torch

from agentrl.model.folder import stamp_model_digest

# The safetensors format's dtype names (https://github.com/huggingface/safetensors, "Format").
SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
WEIGHTS_NAME = "model.safetensors"


def distinct_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` without the aliases of tied weights: of the names whose tensor is the
    same memory (same address, dtype, shape and strides), the first is kept, as transformers does
    for the tied output embedding (``lm_head.weight`` comes after ``model.embed_tokens.weight``)."""
    kept: dict[str, torch.Tensor] = {}
    seen: set[tuple] = set()
    for name, tensor in model.state_dict().items():
        identity = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
        if tensor.numel() and identity in seen:
            continue
        seen.add(identity)
        kept[name] = tensor
    return kept


def write_safetensors(
    tensors: Mapping[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """Write ``tensors`` as one safetensors file, one tensor in host memory at a time.

    The format: an 8-byte little-endian header length, a JSON header (each name's dtype, shape and
    ``data_offsets`` into the byte buffer; ``__metadata__``), padded with spaces to 8 bytes, then
    the tensors' bytes in header order.
    """
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"{name}: safetensors has no dtype for {tensor.dtype}")
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for tensor in tensors.values():
            host = tensor.detach().to("cpu").contiguous()  # no copy for a contiguous CPU tensor
            out.write(host.reshape(-1).view(torch.uint8).numpy().data)


def save_hf_folder(
    model: torch.nn.Module, tokenizer, folder: str | Path, tensors: Mapping[str, torch.Tensor] | None = None
) -> None:
    """``model`` (a transformers ``PreTrainedModel``) and ``tokenizer`` as a Hugging Face folder;
    ``tensors`` in place of the model's own (a LoRA model's merged weights,
    :class:`agentrl.training.lora.MergedWeights`: read twice, for the header and for the bytes)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.config.dtype = str(model.dtype).split(".")[1]
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    if model.can_generate():
        model.generation_config.save_pretrained(folder)
    write_safetensors(distinct_tensors(model) if tensors is None else tensors, folder / WEIGHTS_NAME)
    tokenizer.save_pretrained(folder)
    stamp_model_digest(folder)
