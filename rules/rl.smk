# GRPO-TCR (docs/recipe.md section 5): the SFT model trained with agentic rollouts on the filtered RL
# set, validated on the eval sets. The checkpoint folder is a param, not an output: Snakemake
# removes a job's outputs before it (re)runs, and a requeued job must find its checkpoints to
# resume (the metrics file is restored from the newest checkpoint).
def grpo_validation_benchmarks():
    """The eval sets GRPO validates on: `grpo.validation.benchmarks`, or every set when null.

    Validation at paper scale costs more than training (4 sets x n=32 every 10 steps is ~13,900
    trajectories); upstream validates on AIME24/25 only, which the paper preset chooses.
    """
    chosen = config["grpo"]["validation"]["benchmarks"]
    if chosen is None:
        return benchmarks()
    unknown = [name for name in chosen if name not in benchmarks()]
    if unknown:
        raise WorkflowError(
            f"grpo.validation.benchmarks names {', '.join(unknown)}, which the data source does not "
            f"write; choose from {', '.join(benchmarks())} (or null for all)"
        )
    return list(chosen)


GRPO_CONFIG = config_params("seed", "rollout", "reward", "sandbox", "tool", "grpo", "tracking")


rule grpo:
    input:
        model=result("models/sft/config.json"),
        train=result("filter/rl_train.parquet"),
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
    priority: 10  # the training chain is the critical path: before evaluations that could wait
    threads: 2
    resources:
        gpu=0,  # the job's GPUs, all on one node (0: one CPU process); the profiles set it for GPU runs
    shell:
        on_gpus(
            "python -m agentrl grpo --config-json {params.cfg:q} --model {params.model_dir} "
            "--train {input.train} --eval {input.eval} --out {params.out_dir} --metrics {output.metrics} "
            "--checkpoint-dir {params.checkpoints} --nproc {resources.gpu} --threads {threads}"
        )
        + " > {log} 2>&1"
