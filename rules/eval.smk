# Benchmark evaluation (docs/recipe.md section 7): every (model, benchmark) is one job, so that
# `snakemake --forcerun evaluate` or one target path re-runs exactly what is asked.
import re


# Model stages (base, sft, rl), then the extra checkpoints named in eval.checkpoints.
EVAL_CHECKPOINTS = config["eval"]["checkpoints"]
EVAL_MODELS = list(config["eval"]["models"]) + list(EVAL_CHECKPOINTS)
# Benchmarks graded as code, whose samples also go out in LiveCodeBench's evaluator format.
CODE_BENCHMARKS = [b for b in benchmarks() if b in ("program", "livecodebench_v6")]
# Only the sampling keys of eval: adding a model or a checkpoint re-runs no finished job.
EVAL_CONFIG = config_params(
    build=lambda wildcards: {
        **{key: config[key] for key in ("seed", "rollout", "reward", "sandbox", "tool", "tracking")},
        "eval": {key: config["eval"][key] for key in ("n", "temperature", "top_p", "max_prompt_tokens")},
    }
)
LIVECODEBENCH_EXPORTS = expand(
    result("eval/{model}/{benchmark}/livecodebench_custom_outputs.json"), model=EVAL_MODELS, benchmark=CODE_BENCHMARKS
)


rule evaluate:
    input:
        # A model folder is tracked by its config.json: the stage's output, or the checkpoint's.
        model=lambda w: (
            checkpoint_config(w.model) if w.model in EVAL_CHECKPOINTS else result(f"models/{w.model}/config.json")
        ),
        problems=result("data/eval/{benchmark}.parquet"),
    output:
        samples=result("eval/{model}/{benchmark}/samples.jsonl"),
        metrics=result("eval/{model}/{benchmark}/metrics.json"),
    log:
        f"{LOGS}/evaluate/{{model}}/{{benchmark}}.log",
    benchmark:
        result("timings/evaluate/{model}/{benchmark}.tsv")
    conda:
        ROLLOUT_ENV
    wildcard_constraints:
        model="|".join(map(re.escape, EVAL_MODELS)) or "(?!)",
        benchmark="|".join(map(re.escape, benchmarks())),
    params:
        **EVAL_CONFIG,
        model_dir=input_dir("model"),
    threads: 1
    resources:
        gpu=0,  # the profiles give each evaluation its GPU(s) (rules/common.smk on_gpus)
    shell:
        on_gpus(
            "python -m agentrl evaluate run --config-json {params.cfg:q} --model {params.model_dir} --threads {threads} "
            "--problems {input.problems} --benchmark {wildcards.benchmark} "
            "--samples {output.samples} --metrics {output.metrics}"
        )
        + " > {log} 2>&1"


rule export_livecodebench:
    input:
        problems=result("data/eval/{benchmark}.parquet"),
        samples=result("eval/{model}/{benchmark}/samples.jsonl"),
    output:
        result("eval/{model}/{benchmark}/livecodebench_custom_outputs.json"),
    log:
        f"{LOGS}/export_livecodebench/{{model}}/{{benchmark}}.log",
    benchmark:
        result("timings/export_livecodebench/{model}/{benchmark}.tsv")
    conda:
        "../envs/report.yaml"
    wildcard_constraints:
        model="|".join(map(re.escape, EVAL_MODELS)) or "(?!)",
        benchmark="|".join(map(re.escape, CODE_BENCHMARKS)) or "(?!)",
    threads: 1
    shell:
        "python -m agentrl evaluate export-livecodebench --problems {input.problems} "
        "--samples {input.samples} --out {output} > {log} 2>&1"
