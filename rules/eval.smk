# Benchmark evaluation (docs/recipe.md section 7): every (model, half, benchmark) is its own shard
# jobs and gather, so that `snakemake --forcerun evaluate` or one target path re-runs exactly what is
# asked. The half (eval.reasoning) is the model card's: agentic in eval/{model}/{benchmark}/, and
# self-contained (no tool) in eval/{model}/self_contained/{benchmark}/.
import re


# Model stages (base, sft, rl), then the extra checkpoints named in eval.checkpoints.
EVAL_CHECKPOINTS = config["eval"]["checkpoints"]
EVAL_MODELS = list(config["eval"]["models"]) + list(EVAL_CHECKPOINTS)
# Benchmarks graded as code, whose samples also go out in LiveCodeBench's evaluator format.
CODE_BENCHMARKS = [b for b in benchmarks() if b in ("program", "livecodebench_v6")]
# The {half} wildcard of each eval.reasoning mode: a folder under the model's (none for agentic).
EVAL_HALF_DIRS = {"agentic": "", "self_contained": "self_contained/"}
EVAL_HALVES = [EVAL_HALF_DIRS[mode] for mode in config["eval"]["reasoning"]]


# Only the sampling keys of eval: adding a model or a checkpoint re-runs no finished job.
EVAL_CONFIG = config_params(
    name="evaluate",
    build=lambda wildcards: {
        **{key: config[key] for key in ("seed", "rollout", "reward", "sandbox", "tool", "tracking")},
        "eval": {key: config["eval"][key] for key in ("n", "temperature", "top_p", "max_prompt_tokens")},
    }
)
LIVECODEBENCH_EXPORTS = eval_results("eval/{model}/{half}{benchmark}/livecodebench_custom_outputs.json", CODE_BENCHMARKS)


# Each (model, benchmark) is sampled by eval.shards jobs (one GPU each in the profiles), each a
# contiguous range of the problems into a resumable shard file (agentrl.sampling.shards), then
# gathered into samples.jsonl and metrics.json (pass@k and maj@k need all samples of a problem).
EVAL_SHARDS = config["eval"]["shards"]
EVAL_WILDCARDS = dict(
    model="|".join(map(re.escape, EVAL_MODELS)) or "(?!)",
    half="|".join(map(re.escape, EVAL_HALF_DIRS.values())),
    benchmark="|".join(map(re.escape, benchmarks())),
)


rule evaluate:
    input:
        model=eval_model_config,
        problems=result("data/eval/{benchmark}.parquet"),
    output:
        shard=result("eval/{model}/{half}{benchmark}/shards/{shard}-of-{shards}.jsonl"),
    log:
        f"{LOGS}/evaluate/{{model}}/{{half}}{{benchmark}}/{{shard}}-of-{{shards}}.log",
    benchmark:
        result("timings/evaluate/{model}/{half}{benchmark}/{shard}-of-{shards}.tsv")
    conda:
        ROLLOUT_ENV
    wildcard_constraints:
        **EVAL_WILDCARDS,
        shard=r"\d+",
        shards=r"\d+",
    params:
        **EVAL_CONFIG,
        model_dir=input_dir("model"),
        reasoning=eval_reasoning,
    threads: 1
    resources:
        gpu=0,  # the profiles give each evaluation shard its GPU (rules/common.smk on_gpus)
    shell:
        on_gpus(
            "python -m agentrl evaluate shard --config {params.cfg:q} --model {params.model_dir} --threads {threads} "
            "--problems {input.problems} --benchmark {wildcards.benchmark} "
            "--shard {wildcards.shard} --shards {wildcards.shards} --reasoning {params.reasoning} --out {output.shard}"
        )
        + " 2>&1 | keep_log {log} || show_error {log}"


rule gather_evaluation:
    input:
        model=eval_model_config,
        problems=result("data/eval/{benchmark}.parquet"),
        shards=lambda w: expand(
            result("eval/{model}/{half}{benchmark}/shards/{shard}-of-{shards}.jsonl"),
            model=w.model,
            half=w.half,
            benchmark=w.benchmark,
            shard=range(EVAL_SHARDS),
            shards=EVAL_SHARDS,
        ),
    output:
        samples=result("eval/{model}/{half}{benchmark}/samples.jsonl"),
        metrics=result("eval/{model}/{half}{benchmark}/metrics.json"),
    log:
        f"{LOGS}/gather_evaluation/{{model}}/{{half}}{{benchmark}}.log",
    benchmark:
        result("timings/gather_evaluation/{model}/{half}{benchmark}.tsv")
    conda:
        "../envs/report.yaml"
    wildcard_constraints:
        **EVAL_WILDCARDS,
    params:
        **EVAL_CONFIG,
        model_dir=input_dir("model"),
        reasoning=eval_reasoning,
    threads: 1
    shell:
        "python -m agentrl evaluate gather --config {params.cfg:q} --model {params.model_dir} "
        "--problems {input.problems} --benchmark {wildcards.benchmark} --reasoning {params.reasoning} --shard-files {input.shards} "
        "--samples {output.samples} --metrics {output.metrics} 2>&1 | keep_log {log} || show_error {log}"


rule export_livecodebench:
    input:
        problems=result("data/eval/{benchmark}.parquet"),
        samples=result("eval/{model}/{half}{benchmark}/samples.jsonl"),
    output:
        result("eval/{model}/{half}{benchmark}/livecodebench_custom_outputs.json"),
    log:
        f"{LOGS}/export_livecodebench/{{model}}/{{half}}{{benchmark}}.log",
    benchmark:
        result("timings/export_livecodebench/{model}/{half}{benchmark}.tsv")
    conda:
        "../envs/report.yaml"
    wildcard_constraints:
        **{**EVAL_WILDCARDS, "benchmark": "|".join(map(re.escape, CODE_BENCHMARKS)) or "(?!)"},
    threads: 1
    shell:
        "python -m agentrl evaluate export-livecodebench --problems {input.problems} "
        "--samples {input.samples} --out {output} 2>&1 | keep_log {log} || show_error {log}"
