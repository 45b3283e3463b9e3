# The run's report: summary table and plots under results/report/, and `snakemake --report`
# (every output flagged with report() below, captions in workflow/report/).
#
# Optional inputs exist by configuration, not by chance: a training stage's log is plotted when
# its model is evaluated, and the filter stats when the RL model is (the RL data exists then).
import shlex

from agentrl.errors import UserInputError
from agentrl.report.tables import read_published

# A released SFT model (sft.from) has no training log.
REPORT_TRAINING_STAGES = [
    stage for stage in ("sft", "rl") if stage in config["eval"]["models"] and not (stage == "sft" and SFT_FROM)
]
# The filter stage's outputs are the RL model's data only when GRPO trains on its selection
# (filter.selection: band); with the whole pool they are made only when asked for.
REPORT_FILTER = "rl" in config["eval"]["models"] and config["filter"]["selection"] == "band"
REPORT_INPUTS = {
    "metrics": eval_results("eval/{model}/{half}{benchmark}/metrics.json"),
    **{f"{stage}_log": result(f"{stage}/metrics.jsonl") for stage in REPORT_TRAINING_STAGES},
    **(
        {"filter_stats": result("filter/stats.json"), "histogram": result("filter/pass_rate_hist.png")}
        if REPORT_FILTER
        else {}
    ),
}
REPORT_OPTIONAL_ARGS = " ".join(
    [
        f"--{stage}-metrics {result(f'{stage}/metrics.jsonl')} --{stage}-plot {result(f'report/training_{stage}.png')}"
        for stage in REPORT_TRAINING_STAGES
    ]
    + ([f"--health-plot {result('report/tool_health_rl.png')}"] if "rl" in REPORT_TRAINING_STAGES else [])
    + (
        [f"--filter-stats {result('filter/stats.json')} --pass-rate-histogram {result('filter/pass_rate_hist.png')}"]
        if REPORT_FILTER
        else []
    )
)
# The published figures beside the measured ones (eval.published: evaluated model -> entry of the
# file); entries for models this config does not evaluate are skipped (a preset maps rl and base,
# an overlay may evaluate only one of them).
# (beside this file's checkout, also when another Snakefile includes it)
PUBLISHED_FILE = str(Path(workflow.current_basedir).parent / "src" / "agentrl" / "resources" / "published.yaml")
# A misspelt entry (or a broken file) stops the workflow now, not in the report after days of training.
try:
    _published_entries = sorted(read_published(PUBLISHED_FILE))
except UserInputError as error:
    sys.exit(str(error))
_unknown_published = sorted(set(config["eval"]["published"].values()) - {None, *_published_entries})
if _unknown_published:
    raise ValueError(
        f"config: eval.published names {_unknown_published}, which {PUBLISHED_FILE} does not hold "
        f"(its entries: {_published_entries})"
    )
REPORT_PUBLISHED_ARGS = " ".join(
    f"--published-model {shlex.quote(f'{model}={name}')}"
    for model, name in config["eval"]["published"].items()
    if model in EVAL_MODELS and name is not None
)
# Each evaluated model's config.json: the report lists where the models not trained here came from.
REPORT_MODEL_CONFIGS = {
    model: checkpoint_config(model) if model in EVAL_CHECKPOINTS else result(f"models/{model}/config.json")
    for model in EVAL_MODELS
}
REPORT_TARGETS = [result("report/summary.md")]
# The cost of every stage (agentrl.report.cost), written by the report job from Snakemake's
# benchmark files of the jobs before it (it waits for the exports too, so that every job of the
# default target but itself has written its file) and the stages' token counts.
# The copying pretraining is a row of its own where SFT trained here from it.
REPORT_PRETRAIN = PRETRAIN and "sft" in REPORT_TRAINING_STAGES
COST_INPUTS = {
    **{f"{stage}_model": result(f"models/{stage}/config.json") for stage in REPORT_TRAINING_STAGES},
    **({"pretrain_model": result("models/pretrained/config.json")} if REPORT_PRETRAIN else {}),
    **({"scoring_samples": result("filter/samples.jsonl")} if REPORT_FILTER else {}),
    "eval_samples": eval_results("eval/{model}/{half}{benchmark}/samples.jsonl"),
    "exports": LIVECODEBENCH_EXPORTS,
}
COST_ARGS = " ".join(
    [f"--{stage}-metrics {result(f'{stage}/metrics.jsonl')}" for stage in REPORT_TRAINING_STAGES]
    + [f"--{stage}-model {result(f'models/{stage}')}" for stage in REPORT_TRAINING_STAGES]
    + ([f"--scoring-samples {result('filter/samples.jsonl')}"] if REPORT_FILTER else [])
    + (
        [f"--pretrain-metrics {result('pretrain/metrics.jsonl')} --pretrain-model {result('models/pretrained')}"]
        if REPORT_PRETRAIN
        else []
    )
)


rule report:
    input:
        **REPORT_INPUTS,
        **COST_INPUTS,
        published=PUBLISHED_FILE,
        model_configs=list(REPORT_MODEL_CONFIGS.values()),
    output:
        table_md=report(result("report/summary.md"), caption="../workflow/report/summary.rst", category="Summary"),
        table_csv=report(result("report/summary.csv"), caption="../workflow/report/summary.rst", category="Summary"),
        accuracy=report(
            result("report/accuracy_by_stage.png"),
            caption="../workflow/report/accuracy_by_stage.rst",
            category="Evaluation",
        ),
        modes=report(
            result("report/reasoning_modes.png"),
            caption="../workflow/report/reasoning_modes.rst",
            category="Evaluation",
        ),
        curves=[
            report(
                result(f"report/training_{stage}.png"),
                caption="../workflow/report/training_curves.rst",
                category="Training",
                labels={"stage": stage},
            )
            for stage in REPORT_TRAINING_STAGES
        ],
        health_md=report(result("report/health.md"), caption="../workflow/report/health.rst", category="Health"),
        health_csv=report(result("report/health.csv"), caption="../workflow/report/health.rst", category="Health"),
        health_plot=[
            report(result("report/tool_health_rl.png"), caption="../workflow/report/health.rst", category="Health")
            for stage in REPORT_TRAINING_STAGES
            if stage == "rl"
        ],
        cost_md=report(result("report/cost.md"), caption="../workflow/report/cost.rst", category="Cost"),
        cost_csv=report(result("report/cost.csv"), caption="../workflow/report/cost.rst", category="Cost"),
    log:
        f"{LOGS}/report.log",
    benchmark:
        result("timings/report.tsv")
    conda:
        "../envs/report.yaml"
    params:
        optional=REPORT_OPTIONAL_ARGS,
        published=REPORT_PUBLISHED_ARGS,
        model_configs=" ".join(
            f"--model-config {shlex.quote(f'{model}={path}')}" for model, path in REPORT_MODEL_CONFIGS.items()
        ),
        timings=result("timings"),
        note=f"--note {shlex.quote(config['report']['note'])}" if config["report"]["note"] else "",
        cost=COST_ARGS,
        resources=cost_resources,
    threads: 1
    shell:
        # The cost table first: the summary links it, and links only files that are there.
        "( python -m agentrl report cost --timings {params.timings} {params.cost} {params.resources} "
        "--eval-samples {input.eval_samples} --md {output.cost_md} --csv {output.cost_csv} && "
        "python -m agentrl report --metrics {input.metrics} {params.optional} "
        "--published {input.published} {params.published} {params.model_configs} {params.note} "
        "--table-md {output.table_md} --table-csv {output.table_csv} "
        "--accuracy-plot {output.accuracy} --modes-plot {output.modes} "
        "--health-md {output.health_md} --health-csv {output.health_csv} --cost-md {output.cost_md} ) 2>&1 | keep_log {log} || show_error {log}"
