# GRPO-TCR (docs/recipe.md section 5): the SFT model trained with agentic rollouts on the filtered RL
# set, validated on the eval sets. The checkpoint folder is a param, not an output: Snakemake
# removes a job's outputs before it (re)runs, and a requeued job must find its checkpoints to
# resume (the metrics file is restored from the newest checkpoint).
# The RL set: the model-aware selection (the paper's section 3.3), or with filter.selection: pool
# the whole fitted pool, as the released scripts train (only the prompt-length filter applied).
RL_TRAINING_SET = (
    result("data/rl_pool.parquet") if config["filter"]["selection"] == "pool" else result("filter/rl_train.parquet")
)
GRPO_CONFIG = config_params("seed", "rollout", "reward", "sandbox", "tool", "grpo", "tracking", name="grpo")


rule grpo:
    input:
        model=result("models/sft/config.json"),
        train=RL_TRAINING_SET,
        eval=expand(result("data/eval/{benchmark}.parquet"), benchmark=grpo_validation_benchmarks()),
    output:
        model=result("models/rl/config.json"),
        metrics=result("rl/metrics.jsonl"),
    log:
        f"{LOGS}/grpo.log",
    benchmark:
        result("timings/grpo.tsv")
    conda:
        ROLLOUT_ENV
    params:
        **GRPO_CONFIG,
        model_dir=input_dir("model"),
        out_dir=parent_dir("model"),
        checkpoints=result("rl/checkpoints"),
        gpus_per_node=gpus_per_node,  # rules/common.smk: the gpu resource counts every node's GPUs
    priority: 10  # the training chain is the critical path: before evaluations that could wait
    threads: 2
    resources:
        gpu=0,  # the job's GPUs, every node's (0: one CPU process); the profiles set it for GPU runs
        nodes=1,  # AGENTRL_NODES: more (rules/cluster.smk); one torchrun per node
    shell:
        on_training_nodes(
            "python -m agentrl grpo --config {params.cfg:q} --model {params.model_dir} "
            "--train {input.train} --eval {input.eval} --out {params.out_dir} --metrics {output.metrics} "
            "--checkpoint-dir {params.checkpoints}"
        )
        + " 2>&1 | keep_log {log} || show_error {log}"
