# The paper's three ablations (data, algorithm, reasoning mode) at embedded scale:
# `snakemake --cores all ablations`. An arm is configuration only (config `ablations.arms`): it
# re-runs the same stage CLIs as the main workflow - grpo and evaluate, and for SFT data other
# than real prepare-data and sft - with its overrides, into results/ablations/<arm>/seed<k>/.
#
# Shared, not re-run: the real data (results/data), the base model, the real SFT model and the
# model-aware RL set (results/filter/rl_train.parquet) are the main workflow's own outputs. Each
# other sft_data an arm names (stitched, deliberative, reactive: ABLATION_SFT_DATA) adds one data set
# and one SFT model (for all the arms and seeds that name it), trained from the same base model with
# the same sft section (results/ablations/shared/<sft_data>_data, <sft_data>_sft), and RL on the
# same filtered set as the baseline: the RL data is held fixed so that the SFT data is the only
# difference. Only the sft_data of the arms the questions name is built. The unfiltered arm trains on the pool.
# Every arm and seed gets the same RL budget (ablations.grpo over grpo) and evaluation budget
# (ablations.eval over eval); the seed k is the global seed of its grpo and evaluate jobs, the same
# k in every arm. The variant arms run each variant as named: grpo.algorithm overrides of the
# main config do not apply to them.
import re

ABLATION_RUNS = expand("{arm}/seed{seed}", arm=ABLATION_ARMS, seed=ABLATIONS["seeds"])
ABLATION_MAX_PROBLEMS = ABLATIONS["eval"]["max_problems"]
ABLATION_WILDCARDS = {
    "arm": "|".join(map(re.escape, ABLATION_ARMS)),
    "seed": r"\d+",
    "benchmark": "|".join(map(re.escape, benchmarks())),
}


rule ablation_sft_data:
    output:
        sft=ablation_result("shared/{sft_data}_data/sft.parquet"),
        rl_pool=ablation_result("shared/{sft_data}_data/rl_pool.parquet"),
        eval=expand(ablation_result("shared/{{sft_data}}_data/eval/{benchmark}.parquet"), benchmark=benchmarks()),
    log:
        f"{LOGS}/ablations/shared/{{sft_data}}_data.log",
    benchmark:
        result("timings/ablations/shared/{sft_data}_data.tsv")
    conda:
        "../envs/data.yaml"
    wildcard_constraints:
        sft_data="|".join(ABLATION_SFT_DATA),
    params:
        # The main data config with one key changed (ABLATION_SFT_DATA): the same problems, pool and eval sets.
        **config_params(name="ablation_sft_data", build=ablation_data_cfg, example={"sft_data": "stitched"}),
        eval_dir=parent_dir("eval"),
    priority: 10  # an SFT-data arm's chain (data, SFT, then its GRPO runs) is the ablations' longest
    threads: 2
    shell:
        "python -m agentrl prepare-data --config {params.cfg:q} "
        "--sft {output.sft} --rl-pool {output.rl_pool} --eval-dir {params.eval_dir} 2>&1 | keep_log {log} || show_error {log}"


rule ablation_sft:
    input:
        model=SFT_START,
        data=ablation_result("shared/{sft_data}_data/sft.parquet"),
    output:
        model=ablation_result("shared/{sft_data}_sft/model/config.json"),
        metrics=ablation_result("shared/{sft_data}_sft/metrics.jsonl"),
    log:
        f"{LOGS}/ablations/shared/{{sft_data}}_sft.log",
    benchmark:
        result("timings/ablations/shared/{sft_data}_sft.tsv")
    conda:
        "../envs/train.yaml"
    wildcard_constraints:
        sft_data="|".join(ABLATION_SFT_DATA),
    params:
        **config_params("seed", "sft", "tracking", name="ablation_sft"),  # the main SFT recipe; only the data differs
        model_dir=input_dir("model"),
        out_dir=parent_dir("model"),
        checkpoints=lambda wildcards: ablation_result(f"shared/{wildcards.sft_data}_sft/checkpoints"),
        gpus_per_node=gpus_per_node,  # rules/common.smk: the gpu resource counts every node's GPUs
    priority: 10  # first, not after the other arms' short jobs: its GRPO runs and evaluations wait on it
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


rule ablation_grpo:
    input:
        model=ablation_sft_model,
        train=ablation_rl_data,
        eval=expand(result("data/eval/{benchmark}.parquet"), benchmark=benchmarks()),
    output:
        model=ablation_result("{arm}/seed{seed}/rl/model/config.json"),
        metrics=ablation_result("{arm}/seed{seed}/rl/metrics.jsonl"),
    log:
        f"{LOGS}/ablations/{{arm}}/seed{{seed}}/grpo.log",
    benchmark:
        result("timings/ablations/{arm}/seed{seed}/grpo.tsv")
    conda:
        ROLLOUT_ENV
    wildcard_constraints:
        **ABLATION_WILDCARDS,
    params:
        **config_params(name="ablation_grpo", build=ablation_grpo_cfg, example=ABLATION_EXAMPLE),
        model_dir=input_dir("model"),
        out_dir=parent_dir("model"),
        # a param, not an output: a re-run job must find its checkpoints to resume (rules/rl.smk)
        checkpoints=lambda wildcards: ablation_result(f"{wildcards.arm}/seed{wildcards.seed}/rl/checkpoints"),
        gpus_per_node=gpus_per_node,  # rules/common.smk: the gpu resource counts every node's GPUs
    threads: 2
    resources:
        gpu=0,
        nodes=1,
    shell:
        on_training_nodes(
            "python -m agentrl grpo --config {params.cfg:q} --model {params.model_dir} "
            "--train {input.train} --eval {input.eval} --out {params.out_dir} --metrics {output.metrics} "
            "--checkpoint-dir {params.checkpoints}"
        )
        + " 2>&1 | keep_log {log} || show_error {log}"


rule ablation_evaluate:
    # Every benchmark of one arm and seed in one job (each with its own seed, so its files are a
    # job of its own's): at this budget a benchmark samples in seconds, and a process per
    # benchmark spent more on start-up than on sampling.
    input:
        model=ablation_result("{arm}/seed{seed}/rl/model/config.json"),
        problems=expand(result("data/eval/{benchmark}.parquet"), benchmark=benchmarks()),
    output:
        samples=expand(ablation_result("{{arm}}/seed{{seed}}/eval/{benchmark}/samples.jsonl"), benchmark=benchmarks()),
        metrics=expand(ablation_result("{{arm}}/seed{{seed}}/eval/{benchmark}/metrics.json"), benchmark=benchmarks()),
    log:
        f"{LOGS}/ablations/{{arm}}/seed{{seed}}/evaluate.log",
    benchmark:
        result("timings/ablations/{arm}/seed{seed}/evaluate.tsv")
    conda:
        ROLLOUT_ENV
    wildcard_constraints:
        **ABLATION_WILDCARDS,
    params:
        **config_params(name="ablation_evaluate", build=ablation_eval_cfg, example=ABLATION_EXAMPLE),
        model_dir=input_dir("model"),
        benchmarks=benchmarks(),
        max_problems="" if ABLATION_MAX_PROBLEMS is None else f"--max-problems {ABLATION_MAX_PROBLEMS}",
    threads: 1
    resources:
        gpu=0,
    shell:
        on_gpus(
            "python -m agentrl evaluate run --config {params.cfg:q} --model {params.model_dir} --threads {threads} "
            "--problems {input.problems} --benchmark {params.benchmarks} {params.max_problems} "
            "--samples {output.samples} --metrics {output.metrics}"
        )
        + " 2>&1 | keep_log {log} || show_error {log}"


rule ablation_report:
    input:
        training=expand(ablation_result("{run}/rl/metrics.jsonl"), run=ABLATION_RUNS),
        eval_metrics=expand(ablation_result("{run}/eval/{benchmark}/metrics.json"), run=ABLATION_RUNS, benchmark=benchmarks()),
        samples=expand(ablation_result("{run}/eval/{benchmark}/samples.jsonl"), run=ABLATION_RUNS, benchmark=benchmarks()),
    output:
        tables=[
            report(
                ablation_result(f"{question}.{ext}"),
                caption="../workflow/report/ablations_tables.rst",
                category="Ablations",
                subcategory=question,
                labels={"question": question, "file": ext},
            )
            for question in ABLATION_QUESTIONS
            for ext in ("md", "csv")
        ],
        plots=[
            report(
                ablation_result(f"{question}.png"),
                caption="../workflow/report/ablations_plots.rst",
                category="Ablations",
                subcategory=question,
                labels={"question": question, "file": "png"},
            )
            for question in ABLATION_QUESTIONS
        ],
    log:
        f"{LOGS}/ablations/report.log",
    benchmark:
        result("timings/ablations/report.tsv")
    conda:
        "../envs/report.yaml"
    params:
        **config_params("ablations", name="ablation_report"),
        out_dir=lambda wildcards, output: str(Path(output.tables[0]).parent),
    threads: 1
    shell:
        "python -m agentrl report ablations --config {params.cfg:q} --training {input.training} "
        "--eval-metrics {input.eval_metrics} --samples {input.samples} --out-dir {params.out_dir} 2>&1 | keep_log {log} || show_error {log}"


rule ablations:
    localrule: True
    input:
        rules.ablation_report.output,
