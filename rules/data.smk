rule prepare_data:
    output:
        sft=result("data/sft.parquet"),
        rl_pool=result("data/rl_pool.parquet"),
        eval=expand(result("data/eval/{benchmark}.parquet"), benchmark=benchmarks()),
    log:
        f"{LOGS}/prepare_data.log",
    benchmark:
        result("timings/prepare_data.tsv")
    conda:
        "../envs/data.yaml"
    params:
        # reward.unknown_source only: every row is routed to a verifier here, before any rollout.
        cfg=json.dumps(
            {
                **{key: config[key] for key in ("seed", "data", "sandbox", "tool")},
                "reward": {"unknown_source": config["reward"]["unknown_source"]},
            },
            sort_keys=True,
            separators=(",", ":"),
        ),
        eval_dir=parent_dir("eval"),
    threads: 2
    shell:
        "python -m agentrl prepare-data --config-json {params.cfg:q} "
        "--sft {output.sft} --rl-pool {output.rl_pool} --eval-dir {params.eval_dir} > {log} 2>&1"
