"""The colocated engine's memory plan (``rollout.vllm.colocated_memory: measured``): its arithmetic on
the paper preset's shapes (docs/paper-scale.md quotes these figures), and what it refuses."""

from __future__ import annotations

import pytest

from agentrl.rollout.memory_plan import (
    GIB,
    colocated_memory_plan,
    kv_bytes_per_token,
    model_kv_bytes_per_token,
    trainer_growth_bytes,
)

QWEN3_4B = 4_022_468_096  # parameters (tied embeddings)
CONTEXT = 2560 + 150 + 20480  # the paper preset's prompt, tool schema and response budget
H100 = 81559 * 2**20  # total bytes as CUDA reports them
H200 = 143771 * 2**20


def _paper_plan(total: int):
    resident = QWEN3_4B * 2 + QWEN3_4B * 4 // 8  # bf16 weights, fp32 master shard of 8 ranks
    return colocated_memory_plan(
        total_bytes=total,
        free_bytes=total - resident - int(0.6 * GIB),  # and the CUDA context
        trainer_growth=trainer_growth_bytes(QWEN3_4B, 8, 2, 2),
        weight_bytes=QWEN3_4B * 2,
        kv_per_token=kv_bytes_per_token(36, 8, 128, 2),
        trajectory_tokens=CONTEXT,
        trajectories_per_rank=64 * 16 // 8,
    )


def test_kv_per_token_and_trainer_growth_of_qwen3_4b_on_eight_ranks():
    assert kv_bytes_per_token(36, 8, 128, 2) == 147_456  # 144 KiB
    # ZeRO-2: Adam's two fp32 moments and the fp32 gradient partition of an eighth
    assert trainer_growth_bytes(QWEN3_4B, 8, 2, 2) == 12 * QWEN3_4B // 8
    assert trainer_growth_bytes(1000, 1, 0, 2) == 6000  # ZeRO-0: moments and gradients in the module's dtype


@pytest.mark.parametrize(
    ("total", "share", "kv_tokens", "at_once"), [(H100, 0.779, 368_240, 15), (H200, 0.875, 810_637, 34)]
)
def test_the_paper_preset_plan_on_80_and_141_gb(total, share, kv_tokens, at_once):
    plan = _paper_plan(total)
    assert plan.gpu_memory_utilization == pytest.approx(share, abs=1e-3)
    assert plan.kv_tokens == kv_tokens and plan.full_trajectories_at_once == at_once
    # more KV than the fixed 0.6 share gives (its cache: 0.6 x total - weights - overhead)
    assert plan.kv_tokens > (0.6 * total - QWEN3_4B * 2 - 4 * GIB) / 147_456 * 1.35
    assert not plan.holds_rollout_batch, "128 trajectories of 23K tokens are ~400 GiB: no GPU holds them"
    assert f"{at_once} of the rank's 128 trajectories" in plan.summary()


def test_a_small_rollout_batch_fits_and_no_room_is_refused():
    small = colocated_memory_plan(
        total_bytes=80 * GIB,
        free_bytes=70 * GIB,
        trainer_growth=6 * GIB,
        weight_bytes=8 * GIB,
        kv_per_token=147_456,
        trajectory_tokens=4096,
        trajectories_per_rank=16,
    )
    assert small.engine_bytes == 62 * GIB and small.kv_cache_bytes == 50 * GIB and small.holds_rollout_batch
    with pytest.raises(ValueError, match="colocated_memory: fraction"):
        colocated_memory_plan(
            total_bytes=80 * GIB,
            free_bytes=16 * GIB,
            trainer_growth=6 * GIB,
            weight_bytes=8 * GIB,
            kv_per_token=147_456,
            trajectory_tokens=4096,
            trajectories_per_rank=16,
        )


def test_kv_per_token_is_read_from_the_model_folder(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,'
        ' "hidden_size": 2560}'
    )
    assert model_kv_bytes_per_token(tmp_path, 2) == 147_456


def test_a_measured_share_replaces_the_configured_fraction_of_a_colocated_engine():
    from agentrl.config import load_config
    from agentrl.rollout.vllm_engine import engine_arguments

    cfg = load_config({"rollout": {"vllm": {"colocated_gpu_memory_utilization": 0.6}}}).rollout
    assert cfg.vllm.colocated_memory == "fraction", "the default keeps the configured fraction"
    kwargs = {"device": "cuda", "seed": 0, "colocated": True, "max_model_len": 128}
    assert engine_arguments("m", cfg, **kwargs)["gpu_memory_utilization"] == 0.6
    assert engine_arguments("m", cfg, **kwargs, colocated_share=0.78)["gpu_memory_utilization"] == 0.78
