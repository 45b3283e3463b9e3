# Model-aware RL data (docs/recipe.md section 6): the SFT model rates the RL pool, then the band and
# the optional histogram matching pick the RL training set. Two rules, so that a changed
# threshold or target histogram re-runs only the cheap selection: each rule's params hold only
# the filter keys it reads (scoring: how the rollouts are drawn; selection: the thresholds).
FILTER_SCORE_CONFIG = config_params(name="filter_score", build=lambda wildcards: filter_score_config())
FILTER_SELECT_CONFIG = config_params(
    name="filter_select",
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


# Scoring is scattered over filter.shards jobs (one GPU each in the profiles), each rating a
# contiguous range of the pool into a resumable shard file (agentrl.sampling.shards), and
# gathered into the two files select_rl_data reads. Every rollout is seeded by (seed, problem id,
# sample index), so the gathered files are byte-identical for any shard count.
FILTER_SHARD_FILES = expand(
    result("filter/shards/{shard}-of-{shards}.jsonl"), shard=range(config["filter"]["shards"]), shards=config["filter"]["shards"]
)


rule score_rl_pool:
    input:
        model=result("models/sft/config.json"),
        pool=result("data/rl_pool.parquet"),
    output:
        shard=result("filter/shards/{shard}-of-{shards}.jsonl"),
    log:
        f"{LOGS}/score_rl_pool/{{shard}}-of-{{shards}}.log",
    benchmark:
        result("timings/score_rl_pool/{shard}-of-{shards}.tsv")
    conda:
        ROLLOUT_ENV
    wildcard_constraints:
        shard=r"\d+",
        shards=r"\d+",
    params:
        **FILTER_SCORE_CONFIG,
        model_dir=input_dir("model"),
    priority: 10  # the training chain is the critical path: before evaluations that could wait
    threads: 2
    resources:
        gpu=0,  # the profiles give each scoring shard its GPU (rules/common.smk on_gpus)
    shell:
        on_gpus(
            "python -m agentrl filter score-shard --config {params.cfg:q} --model {params.model_dir} "
            "--threads {threads} --pool {input.pool} --shard {wildcards.shard} --shards {wildcards.shards} "
            "--out {output.shard}"
        )
        + " 2>&1 | keep_log {log} || show_error {log}"


rule gather_pass_rates:
    input:
        pool=result("data/rl_pool.parquet"),
        shards=FILTER_SHARD_FILES,
    output:
        pass_rates=result("filter/pass_rates.parquet"),
        samples=result("filter/samples.jsonl"),
    log:
        f"{LOGS}/gather_pass_rates.log",
    # No benchmark: Snakemake refuses it on a cached rule (a cache hit has no timing to write).
    conda:
        "../envs/report.yaml"
    cache: True
    params:
        **FILTER_SCORE_CONFIG,
    priority: 10
    threads: 1
    shell:
        "python -m agentrl filter gather --config {params.cfg:q} --pool {input.pool} "
        "--shard-files {input.shards} --out {output.pass_rates} --samples {output.samples} 2>&1 | keep_log {log} || show_error {log}"


# What the pass rates are computed from, as a file of its own that select_rl_data depends on: the
# scoring config (the keys that re-run the scoring, not filter.shards) and the checksums of the
# SFT model and the pool. It is re-made exactly when the pass rates change meaning; see
# select_rl_data.
rule scoring_config:
    input:
        model=result("models/sft/config.json"),
        pool=result("data/rl_pool.parquet"),
    output:
        result("filter/scoring_config.json"),
    log:
        f"{LOGS}/scoring_config.log",
    conda:
        "../envs/report.yaml"
    params:
        **FILTER_SCORE_CONFIG,
    threads: 1
    shell:
        "python -m agentrl filter scoring-config --config {params.cfg:q} --model-config {input.model} "
        "--pool {input.pool} --out {output} 2>&1 | keep_log {log} || show_error {log}"


# The pass rates are ancient() here: a new filter.shards re-runs the scoring shards (which take the
# finished problems over from the old shard files) and the gather, whose byte-identical result
# must not re-run the selection and GRPO; Snakemake would (it re-runs the consumers of every job
# it runs, and does not even look at their params then). So what changes the pass rates reaches
# this rule through scoring_config, a job that runs exactly then. It must be a job's output:
# Snakemake never checks the own inputs of a job downstream of one it runs (here, of the
# scoring shards), so an SFT model retrained by `--until sft` would otherwise re-run the scoring
# but not the selection, GRPO and the rl evaluation (tests/test_reruns.py). After
# `--forcerun score_rl_pool`, force this rule as well.
rule select_rl_data:
    input:
        pass_rates=ancient(result("filter/pass_rates.parquet")),
        scoring=result("filter/scoring_config.json"),
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
        "python -m agentrl filter select --config {params.cfg:q} --pass-rates {input.pass_rates} "
        "--pool {input.pool} --out {output.rl_train} --stats {output.stats} "
        "--histogram {output.histogram} 2>&1 | keep_log {log} || show_error {log}"
