# Hub downloads run where the network is: hub_download is a local rule (the submitting host under
# a cluster profile) that fills the local hub cache at the pinned revisions (agentrl.hub), and
# the rules reading hub data or models run with HF_HUB_OFFLINE=1 on whichever node, reading
# that cache. Without hub sources (the embedded default) there is no download job.
HUB_MANIFEST = [result("hub/manifest.json")] if NEEDS_HUB else []
HUB_OFFLINE = int(NEEDS_HUB)  # HF_HUB_OFFLINE for the rules reading what hub_download fetched


rule hub_download:
    localrule: True
    output:
        result("hub/manifest.json"),
    log:
        f"{LOGS}/hub_download.log",
    conda:
        "../envs/data.yaml"
    params:
        **config_params("data", "model", name="hub_download"),
    threads: 1
    shell:
        "python -m agentrl hub-download --config {params.cfg:q} --manifest {output} 2>&1 | keep_log {log} || show_error {log}"


rule prepare_data:
    input:
        HUB_MANIFEST,
    output:
        sft=result("data/sft.parquet"),
        rl_pool=result("data/prepared/rl_pool.parquet"),
        eval=expand(result("data/prepared/eval/{benchmark}.parquet"), benchmark=benchmarks()),
    log:
        f"{LOGS}/prepare_data.log",
    benchmark:
        result("timings/prepare_data.tsv")
    conda:
        "../envs/data.yaml"
    params:
        **config_params(name="prepare_data", build=lambda wildcards: prepare_data_cfg(config["data"])),
        eval_dir=parent_dir("eval"),
        hub_offline=HUB_OFFLINE,
    threads: 2
    shell:
        "HF_HUB_OFFLINE={params.hub_offline} python -m agentrl prepare-data --config {params.cfg:q} "
        "--sft {output.sft} --rl-pool {output.rl_pool} --eval-dir {params.eval_dir} 2>&1 | keep_log {log} || show_error {log}"


# Prompts over the limits are dropped here, before any rollout, and counted per data source in
# results/data/prompt_lengths/ (upstream's filter_overlong_prompts): the RL pool to
# rollout.max_prompt_tokens, the eval sets to eval.max_prompt_tokens (two rules: a changed eval
# limit re-runs no RL job). The base model's tokenizer measures them (the SFT and RL models share
# it); with sft.from and no base model evaluated, the released SFT model's (no base model is built
# for it). A base model that is built anyway keeps measuring: then a changed sft.from re-runs no
# fit job, and so not the base model's evaluation either.
FIT_LENGTH_KEYS = ("max_prompt_tokens", "prompt_length_with_tools")
FIT_TOKENIZER = (
    result("models/sft/config.json")
    if SFT_FROM is not None and "base" not in config["eval"]["models"]
    else result("models/base/config.json")
)


rule fit_rl_prompts:
    input:
        model=FIT_TOKENIZER,
        problems=result("data/prepared/rl_pool.parquet"),
    output:
        problems=result("data/rl_pool.parquet"),
        stats=result("data/prompt_lengths/rl_pool.json"),
    log:
        f"{LOGS}/fit_rl_prompts.log",
    benchmark:
        result("timings/fit_rl_prompts.tsv")
    conda:
        "../envs/train.yaml"  # transformers: the tokenizer
    params:
        **config_params(
            name="fit_rl_prompts",
            build=lambda wildcards: {"rollout": {k: config["rollout"][k] for k in FIT_LENGTH_KEYS}},
        ),
        model_dir=input_dir("model"),
        out_dir=parent_dir("problems"),
    threads: 1
    shell:
        "python -m agentrl fit-prompts --config {params.cfg:q} --model {params.model_dir} --limit rollout "
        "--problems {input.problems} --out-dir {params.out_dir} --stats {output.stats} 2>&1 | keep_log {log} || show_error {log}"


rule fit_eval_prompts:
    input:
        model=FIT_TOKENIZER,
        problems=expand(result("data/prepared/eval/{benchmark}.parquet"), benchmark=benchmarks()),
    output:
        problems=expand(result("data/eval/{benchmark}.parquet"), benchmark=benchmarks()),
        stats=result("data/prompt_lengths/eval.json"),
    log:
        f"{LOGS}/fit_eval_prompts.log",
    benchmark:
        result("timings/fit_eval_prompts.tsv")
    conda:
        "../envs/train.yaml"  # transformers: the tokenizer
    params:
        **config_params(
            name="fit_eval_prompts",
            build=lambda wildcards: {
                "rollout": {"prompt_length_with_tools": config["rollout"]["prompt_length_with_tools"]},
                "eval": {"max_prompt_tokens": config["eval"]["max_prompt_tokens"]},
            }
        ),
        model_dir=input_dir("model"),
        out_dir=parent_dir("problems"),
    threads: 1
    shell:
        "python -m agentrl fit-prompts --config {params.cfg:q} --model {params.model_dir} --limit eval "
        "--problems {input.problems} --out-dir {params.out_dir} --stats {output.stats} 2>&1 | keep_log {log} || show_error {log}"
