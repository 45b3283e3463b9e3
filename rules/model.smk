rule base_model:
    input:
        sft=result("data/sft.parquet"),
        rl_pool=result("data/rl_pool.parquet"),
    output:
        config=result("models/base/config.json"),
    log:
        f"{LOGS}/base_model.log",
    benchmark:
        result("timings/base_model.tsv")
    conda:
        "../envs/train.yaml"
    params:
        cfg=config_json("seed", "model"),
        out_dir=parent_dir("config"),
    threads: 1
    shell:
        "python -m agentrl base-model --config-json {params.cfg:q} "
        "--sft {input.sft} --rl-pool {input.rl_pool} --out {params.out_dir} > {log} 2>&1"
