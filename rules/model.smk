import re


rule base_model:
    input:
        HUB_MANIFEST,  # rules/data.smk: a hub model.base is read offline from the cache it fills
        sft=result("data/sft.parquet"),
        rl_pool=result("data/prepared/rl_pool.parquet"),  # before fit_prompts: it needs this tokenizer
    output:
        config=result("models/base/config.json"),
    log:
        f"{LOGS}/base_model.log",
    benchmark:
        result("timings/base_model.tsv")
    conda:
        "../envs/train.yaml"
    params:
        # the model section less the pretraining's keys (rule pretrain below reads those)
        **config_params(
            name="base_model",
            build=lambda w: {
                "seed": config["seed"],
                "model": {
                    **config["model"],
                    "embedded": {k: v for k, v in config["model"]["embedded"].items() if k != "pretrain"},
                },
            }
        ),
        hub_offline=HUB_OFFLINE,
        out_dir=parent_dir("config"),
    threads: 1
    shell:
        "HF_HUB_OFFLINE={params.hub_offline} python -m agentrl base-model --config {params.cfg:q} "
        "--sft {input.sft} --rl-pool {input.rl_pool} --out {params.out_dir} 2>&1 | keep_log {log} || show_error {log}"


# The embedded model's copying pretraining (agentrl.sft.pretrain): SFT's trainer on conversations
# that copy named spans, with model.embedded.pretrain's epochs, batch, lr and warmup in place of
# SFT's; every other sft key applies to it too, and re-runs it when changed.
if PRETRAIN:

    rule copy_corpus:
        output:
            result("data/copy_corpus.parquet"),
        log:
            f"{LOGS}/copy_corpus.log",
        conda:
            "../envs/data.yaml"
        params:
            **config_params(
                name="copy_corpus",
                build=lambda w: pretrain_config(("conversations", "max_spans", "verbatim_share", "letter_share")),
            ),
        threads: 1
        shell:
            "python -m agentrl copy-corpus --config {params.cfg:q} --out {output} 2>&1 | keep_log {log} || show_error {log}"

    rule pretrain:
        input:
            model=result("models/base/config.json"),
            data=result("data/copy_corpus.parquet"),
        output:
            model=result("models/pretrained/config.json"),
            metrics=result("pretrain/metrics.jsonl"),
        log:
            f"{LOGS}/pretrain.log",
        benchmark:
            result("timings/pretrain.tsv")
        conda:
            "../envs/train.yaml"
        params:
            **config_params(
                name="pretrain",
                build=lambda w: {
                    **pretrain_config(),
                    "sft": {k: v for k, v in config["sft"].items() if k not in PRETRAIN_REPLACES},
                    "tracking": config["tracking"],
                }
            ),
            model_dir=input_dir("model"),
            out_dir=parent_dir("model"),
            checkpoints=result("pretrain/checkpoints"),
        priority: 10  # the training chain is the critical path
        threads: 2
        shell:
            # one CPU process: the embedded model only (model.base a hub id or folder is not pretrained)
            "python -m agentrl sft --recipe pretrain --config {params.cfg:q} --model {params.model_dir} "
            "--data {input.data} --out {params.out_dir} --metrics {output.metrics} "
            "--checkpoint-dir {params.checkpoints} --nproc 0 --threads {threads} 2>&1 | keep_log {log} || show_error {log}"


# A released SFT model (sft.from) in place of the sft job: results/models/sft/ links (or downloads)
# it, so filtering, GRPO and evaluation read it as they read a trained one. Local rules: a hub
# download needs the network of the submitting host.
if SFT_FROM is not None:

    ruleorder: released_sft > sft

    rule released_sft:
        input:
            local_model_input(SFT_FROM),
        output:
            model=result("models/sft/config.json"),
        log:
            f"{LOGS}/released_sft.log",
        localrule: True
        conda:
            "../envs/train.yaml"
        params:
            id=SFT_FROM["id"],
            revision=SFT_FROM["revision"] or "",
            out_dir=parent_dir("model"),
        threads: 1
        shell:
            "python -m agentrl fetch-model --key sft.from --id {params.id:q} --revision={params.revision:q} "
            "--out {params.out_dir} 2>&1 | keep_log {log} || show_error {log}"


# eval.checkpoints given as {id, revision}: one local job per model, under results/models/checkpoints/.
rule fetch_checkpoint:
    input:
        lambda w: local_model_input(FETCHED_CHECKPOINTS[w.name]),
    output:
        model=result("models/checkpoints/{name}/config.json"),
    log:
        f"{LOGS}/fetch_checkpoint/{{name}}.log",
    localrule: True
    conda:
        "../envs/train.yaml"
    wildcard_constraints:
        name="|".join(map(re.escape, FETCHED_CHECKPOINTS)) or "(?!)",
    params:
        id=lambda w: FETCHED_CHECKPOINTS[w.name]["id"],
        revision=lambda w: FETCHED_CHECKPOINTS[w.name]["revision"] or "",
        out_dir=parent_dir("model"),
    threads: 1
    shell:
        "python -m agentrl fetch-model --key eval.checkpoints.{wildcards.name} --id {params.id:q} "
        "--revision={params.revision:q} --out {params.out_dir} 2>&1 | keep_log {log} || show_error {log}"
