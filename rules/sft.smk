# SFT on real multi-turn tool-use trajectories (docs/recipe.md section 5), on DeepSpeed. The
# checkpoint folder is a param, not an output: Snakemake removes a job's outputs before it
# (re)runs, and a killed or requeued job must find its checkpoints to resume. The metrics file is
# the output itself, readable while SFT runs: a resumed run rewrites it from the checkpoint's
# records (agentrl.training.metrics), as GRPO does.


rule sft:
    input:
        model=SFT_START,  # rules/common.smk: the pretrained embedded model, else the base model
        data=result("data/sft.parquet"),
    output:
        model=result("models/sft/config.json"),
        metrics=result("sft/metrics.jsonl"),
    log:
        f"{LOGS}/sft.log",
    benchmark:
        result("timings/sft.tsv")
    conda:
        "../envs/train.yaml"
    params:
        **config_params("seed", "sft", "tracking", name="sft"),
        model_dir=input_dir("model"),
        out_dir=parent_dir("model"),
        checkpoints=result("sft/checkpoints"),
        gpus_per_node=gpus_per_node,  # rules/common.smk: the gpu resource counts every node's GPUs
    priority: 10  # the training chain is the critical path: before evaluations that could wait
    threads: 2
    resources:
        gpu=0,  # the job's GPUs, every node's (0: one CPU process); the profiles set it for GPU runs
        nodes=1,  # AGENTRL_NODES: more (rules/cluster.smk); one torchrun per node
    shell:
        on_training_nodes(
            "python -m agentrl sft --config {params.cfg:q} --model {params.model_dir} --data {input.data} "
            "--out {params.out_dir} --metrics {output.metrics} --checkpoint-dir {params.checkpoints}"
        )
        + " 2>&1 | keep_log {log} || show_error {log}"
