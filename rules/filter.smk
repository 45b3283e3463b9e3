# Model-aware RL data (docs/recipe.md section 6): the SFT model rates the RL pool, then the band and
# the optional histogram matching pick the RL training set. Two rules, so that a changed
# threshold or target histogram re-runs only the cheap selection: each rule's params hold only
# the filter keys it reads (scoring: how the rollouts are drawn; selection: the thresholds).
FILTER_SCORE_CONFIG = config_params(
    build=lambda wildcards: {
        **{key: config[key] for key in ("seed", "rollout", "reward", "sandbox", "tool")},
        "filter": {key: config["filter"][key] for key in ("k", "temperature", "top_p")},
    }
)
FILTER_SELECT_CONFIG = config_params(
    build=lambda wildcards: {
        "seed": config["seed"],
        "filter": {
            key: config["filter"][key]
            for key in ("low", "high", "easy_min", "hard_max", "target_histogram", "target_pass_rates", "target_size")
        },
    }
)
# Another model's pass rates when the config matches its histogram (the weak-model preset).
FILTER_TARGET = [config["filter"]["target_pass_rates"]] if config["filter"]["target_pass_rates"] else []


rule score_rl_pool:
    input:
        model=result("models/sft/config.json"),
        pool=result("data/rl_pool.parquet"),
    output:
        pass_rates=result("filter/pass_rates.parquet"),
        samples=result("filter/samples.jsonl"),
    log:
        f"{LOGS}/score_rl_pool.log",
    # No benchmark: Snakemake refuses it on a cached rule (a cache hit has no timing to write);
    # the log states the wall time instead.
    conda:
        ROLLOUT_ENV
    cache: True
    params:
        **FILTER_SCORE_CONFIG,
        model_dir=input_dir("model"),
    priority: 10  # the training chain is the critical path: before evaluations that could wait
    threads: 2
    resources:
        gpu=0,  # the profiles give the scoring job its GPU(s) (rules/common.smk on_gpus)
    shell:
        on_gpus(
            "python -m agentrl filter score --config-json {params.cfg:q} --model {params.model_dir} --threads {threads} "
            "--pool {input.pool} --out {output.pass_rates} --samples {output.samples}"
        )
        + " > {log} 2>&1"


rule select_rl_data:
    input:
        pass_rates=result("filter/pass_rates.parquet"),
        pool=result("data/rl_pool.parquet"),
        target=FILTER_TARGET,
    output:
        rl_train=result("filter/rl_train.parquet"),
        stats=result("filter/stats.json"),
        histogram=report(
            result("filter/pass_rate_hist.png"),
            caption="../workflow/report/pass_rate_hist.rst",
            category="RL data filtering",
        ),
    log:
        f"{LOGS}/select_rl_data.log",
    benchmark:
        result("timings/select_rl_data.tsv")
    conda:
        "../envs/report.yaml"
    params:
        **FILTER_SELECT_CONFIG,
    priority: 10  # the training chain is the critical path: before evaluations that could wait
    threads: 1
    shell:
        "python -m agentrl filter select --config-json {params.cfg:q} --pass-rates {input.pass_rates} "
        "--pool {input.pool} --out {output.rl_train} --stats {output.stats} "
        "--histogram {output.histogram} > {log} 2>&1"
