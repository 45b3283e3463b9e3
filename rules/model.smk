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
        **config_params("seed", "model"),
        hub_offline=HUB_OFFLINE,
        out_dir=parent_dir("config"),
    threads: 1
    shell:
        "HF_HUB_OFFLINE={params.hub_offline} python -m agentrl base-model --config-json {params.cfg:q} "
        "--sft {input.sft} --rl-pool {input.rl_pool} --out {params.out_dir} 2>&1 | keep_log {log}"


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
            "--out {params.out_dir} 2>&1 | keep_log {log}"


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
        "--revision={params.revision:q} --out {params.out_dir} 2>&1 | keep_log {log}"
