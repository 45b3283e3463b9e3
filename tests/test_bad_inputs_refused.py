"""Mistakes a new user makes, refused in one line before any work: exit status 2, no traceback, the
message naming the file, line, key or option, and no output left that looks complete.

Each row of a table is a real input (a YAML file, a folder, an argument) given to a stage as users
run it (``python -m agentrl ...``) or to the workflow's load-time check (``snakemake -n``).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from helpers.stage_inputs import (
    CODE_PROBLEM,
    SFT_EXAMPLE,
    assert_refused,
    fake_model,
    problems_file,
    run_agentrl,
    sft_command,
)
from helpers.workflows import ROOT, run_snakemake

from agentrl.config import load_config, load_config_file
from agentrl.data.records import Problem, SftExample, write_records
from agentrl.errors import DataFormatError

# --------------------------------------------------------------------------- config files and values
# name -> (file content as bytes, fragments the message must hold)
CONFIG_FILES = {
    "duplicate key": (
        b"seed: 1\nrollout:\n  temperature: 0.7\nseed: 2\n",
        ["bad.yaml", "line 4", "'seed' given twice"],
    ),
    "nested duplicate": (b"filter:\n  k: 4\n  low: 0.1\n  k: 8\n", ["bad.yaml", "line 4", "'k' given twice"]),
    "syntax error": (b"seed: 1\nrollout: {temperature: 0.7\n", ["bad.yaml", "not valid YAML at line 3"]),
    "not UTF-8": (b"seed: 1\n# caf\xe9\n", ["bad.yaml", "line 2", "not UTF-8"]),
    "NaN": (b"sft:\n  lr: .nan\n", ["'sft.lr' = nan", "not a finite number"]),
    "infinity": (b"rollout:\n  temperature: .inf\n", ["'rollout.temperature' = inf", "not a finite number"]),
    "empty results_dir": (b'results_dir: ""\n', ["'results_dir'", "non-empty"]),
    "kv heads": (
        b"model:\n  embedded: {num_heads: 4, num_kv_heads: 3}\n",
        ["model.embedded.num_kv_heads (3) must divide model.embedded.num_heads (4)"],
    ),
}


@pytest.mark.parametrize("case", sorted(CONFIG_FILES))
def test_a_bad_config_file_is_refused_before_the_model_is_built(tmp_path, case):
    content, fragments = CONFIG_FILES[case]
    (tmp_path / "bad.yaml").write_bytes(content)
    completed = run_agentrl("base-model", "--config", "bad.yaml", "--out", tmp_path / "base", cwd=tmp_path)
    assert_refused(completed, *fragments)
    assert not (tmp_path / "base").exists(), "nothing built"


def test_a_config_path_that_is_a_folder_or_missing_names_it(tmp_path):
    (tmp_path / "cfg").mkdir()
    assert_refused(run_agentrl("base-model", "--config", "cfg", "--out", "base", cwd=tmp_path), "cfg: is a folder")
    assert_refused(run_agentrl("base-model", "--config", "nope.yaml", "--out", "base", cwd=tmp_path), "nope.yaml")
    assert not (tmp_path / "base").exists()


def test_an_integral_float_at_an_integer_key_reads_as_the_integer(tmp_path):
    path = tmp_path / "k.yaml"
    path.write_text("filter:\n  k: 2.0\ngrpo:\n  batch_prompts: 4.0\n")
    cfg = load_config_file(path)
    assert (cfg.filter.k, cfg.grpo.batch_prompts) == (2, 4)
    assert type(cfg.filter.k) is int and list(range(cfg.filter.k)) == [0, 1]
    with pytest.raises(ValueError, match="filter.k"):
        load_config({"filter": {"k": 2.5}})  # not integral: refused, never rounded


# --------------------------------------------------------------------------- stage arguments and paths
def _dead_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"  # nothing listens once the probe is closed


def _cases(tmp_path: Path) -> dict[str, tuple[list, list[str], list[Path]]]:
    """name -> (agentrl arguments, fragments of the message, paths that must not exist after)."""
    model = fake_model(tmp_path / "model")
    data = problems_file(tmp_path / "sft.parquet", [SFT_EXAMPLE.to_row()])
    problems = problems_file(tmp_path / "eval.parquet", [CODE_PROBLEM.to_row()])
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "prog.py").write_text("print(1)\n")
    fusion = tmp_path / "fusion.yaml"
    fusion.write_text(f"sandbox: {{backend: sandbox_fusion, sandbox_fusion_url: '{_dead_url()}'}}\n")
    metrics = tmp_path / "out/metrics.jsonl"
    return {
        "sft --out is a file": (
            sft_command(tmp_path, model, data, out=tmp_path / "a_file"),
            ["--out", "a_file", "not a folder"],
            [metrics],
        ),
        "sft --metrics is a folder": (
            sft_command(tmp_path, model, data, metrics=tmp_path / "a_folder"),
            ["--metrics", "a_folder", "is an existing folder"],
            [tmp_path / "out/sft"],
        ),
        "sft --deepspeed-config missing": (
            [*sft_command(tmp_path, model, data), "--deepspeed-config", tmp_path / "ds.json"],
            ["--deepspeed-config", "ds.json", "not found"],
            [metrics, tmp_path / "out/sft"],
        ),
        "negative --max-problems": (
            [
                "evaluate",
                "run",
                "--model",
                model,
                "--problems",
                problems,
                "--samples",
                tmp_path / "s.jsonl",
                "--metrics",
                tmp_path / "m.json",
                "--max-problems",
                "-1",
            ],  # fmt: skip
            ["--max-problems", "-1 is below 1"],
            [tmp_path / "s.jsonl", tmp_path / "m.json"],
        ),
        "shard index out of range": (
            [
                "evaluate",
                "shard",
                "--model",
                model,
                "--problems",
                problems,
                "--benchmark",
                "b",
                "--shard",
                "2",
                "--shards",
                "2",
                "--out",
                tmp_path / "shard.jsonl",
            ],  # fmt: skip
            ["--shard 2 is not in 0..1"],
            [tmp_path / "shard.jsonl", tmp_path / "shard.jsonl.partial"],
        ),
        "negative --shard": (
            [
                "filter",
                "score-shard",
                "--model",
                model,
                "--pool",
                problems,
                "--shard",
                "-1",
                "--shards",
                "2",
                "--out",
                tmp_path / "shard.jsonl",
            ],  # fmt: skip
            ["--shard", "-1 is below 0"],
            [tmp_path / "shard.jsonl"],
        ),
        "sandbox_fusion URL nothing answers at": (
            ["sandbox", "--config", fusion, tmp_path / "prog.py"],
            ["sandbox.sandbox_fusion_url", "127.0.0.1", "no SandboxFusion service answers"],
            [],
        ),
        "unknown data source": (
            ["reward", "--data-source", "my_benchmark", "--ground-truth", "1", "--response-file", tmp_path / "prog.py"],
            ["my_benchmark"],
            [],
        ),
    }


CASE_NAMES = [
    "sft --out is a file",
    "sft --metrics is a folder",
    "sft --deepspeed-config missing",
    "negative --max-problems",
    "shard index out of range",
    "negative --shard",
    "sandbox_fusion URL nothing answers at",
    "unknown data source",
]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_a_bad_argument_or_path_is_refused_before_any_work(tmp_path, case):
    args, fragments, absent = _cases(tmp_path)[case]
    completed = run_agentrl(*args, cwd=tmp_path)
    assert_refused(completed, *fragments)
    assert "Loading" not in completed.stderr and "step 1" not in completed.stderr, "refused before the model loaded"
    for path in absent:
        assert not path.exists(), path


def test_the_case_table_is_complete(tmp_path):
    assert sorted(_cases(tmp_path)) == sorted(CASE_NAMES)


# --------------------------------------------------------------------------- the workflow's load-time check
def _dry_run(workdir: Path, overlay: str):
    (workdir / "overlay.yaml").write_text(overlay)
    return run_snakemake(workdir, "-n", "--configfile", str(ROOT / "config.yaml"), "overlay.yaml")


WORKFLOW_CASES = {
    "duplicate key in an overlay": ("grpo:\n  lr: 1.0e-6\ngrpo:\n  kl_coef: 0.0\n", ["overlay.yaml", "line 3", "'grpo' given twice"]),
    "sft.from without config.json": ("sft:\n  from: {released}\n", ["sft.from", "no config.json"]),
    "model.base a mistyped path": ("model:\n  base: ./models/qwen\n", ["model.base='./models/qwen'", "probably a typo"]),
    "fetched checkpoint a mistyped path": ("eval:\n  checkpoints: {{mine: {{id: results/rl/step_9}}}}\n", ["eval.checkpoints.mine='results/rl/step_9'", "probably a typo"]),
    "eval.checkpoints without tokenizer": ("eval:\n  checkpoints: {{mine: {tokenless}}}\n", ["eval.checkpoints.mine", "no tokenizer"]),
    "results_dir under a file": ("results_dir: a_file/results\n", ["overlay.yaml", "results_dir='a_file/results' is under a_file, which is a file"]),
    "results_dir a file": ("results_dir: a_file\n", ["overlay.yaml", "results_dir='a_file' is a file, not a folder"]),
    "model.base without a chat template": ("model:\n  base: {templateless}\n", ["model.base", "templateless", "no chat template"]),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(WORKFLOW_CASES))
def test_the_workflow_refuses_at_load(tmp_path, case):
    released = tmp_path / "released"
    released.mkdir()
    (released / "weights.safetensors").write_bytes(b"")
    tokenless = fake_model(tmp_path / "tokenless", tokenizer=False)
    templateless = fake_model(tmp_path / "templateless")
    (templateless / "chat_template.jinja").unlink()
    overlay, fragments = WORKFLOW_CASES[case]
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "a_file").write_text("a file where results_dir wants a folder")
    done = _dry_run(workdir, overlay.format(released=released, tokenless=tokenless, templateless=templateless))
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Traceback" not in output, output[-3000:]
    for fragment in fragments:
        assert fragment in output, (fragment, output[-3000:])
    assert "Job stats" not in output, "refused before any job was planned"
    assert not (workdir / "results").exists()


# --------------------------------------------------------------------------- a local path mistyped as a hub id
_UPSTREAM = {"id": "Gen-Verse/Open-AgentRL-30K", "file": "x.parquet", "revision": None}
# name -> (stage arguments, the refused key and value)
PATH_TYPOS = {
    "model.base with ./": (["base-model", "--config-json", json.dumps({"model": {"base": "./models/qwen"}}), "--out", "base"], "model.base='./models/qwen'"),
    "model.base absolute": (["base-model", "--config-json", json.dumps({"model": {"base": "/data/x"}}), "--out", "base"], "model.base='/data/x'"),
    "model.base under an existing folder": (["base-model", "--config-json", json.dumps({"model": {"base": "models/Qwen3"}}), "--out", "base"], "model.base='models/Qwen3'"),
    "an upstream data set": (["prepare-data", "--config-json", json.dumps({"data": {"source": "upstream", "upstream": {"sft": _UPSTREAM, "rl": {**_UPSTREAM, "id": "data/rl/pool.parquet"}, "eval": {}}}}),
                              "--sft", "s.parquet", "--rl-pool", "r.parquet", "--eval-dir", "e"], "data.upstream.rl.id='data/rl/pool.parquet'"),
    "a fetched model": (["fetch-model", "--id", "~/released/sft", "--key", "sft.from", "--out", "base"], "sft.from='~/released/sft'"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(PATH_TYPOS))
def test_a_mistyped_local_path_is_refused_before_any_download(tmp_path, case):
    args, named = PATH_TYPOS[case]
    (tmp_path / "models").mkdir()
    completed = run_agentrl(*args, cwd=tmp_path)
    assert_refused(completed, named, "probably a typo")
    assert not (tmp_path / "base").exists() and not (tmp_path / "s.parquet").exists()


def test_a_model_folder_check_reads_json_as_json(tmp_path):
    folder = fake_model(tmp_path / "m")
    (folder / "config.json").write_text(json.dumps(["not", "an", "object"]))
    problems = problems_file(tmp_path / "p.parquet", [CODE_PROBLEM.to_row()])
    completed = run_agentrl("rollout", "--model", folder, "--problems", problems, "--out", "o.jsonl", cwd=tmp_path)
    assert_refused(completed, "config.json", "expected a JSON object")


# --------------------------------------------------------------------------- data rows
# name -> (the row's changed columns, the column named)
BAD_ROWS = {
    "empty prompt": ({"prompt": "[]"}, "prompt"),
    "blank user turn": ({"prompt": json.dumps([{"role": "system", "content": "sys"}, {"role": "user", "content": " "}])}, "prompt"),
    "empty math ground truth": ({"ground_truth": json.dumps("")}, "ground_truth"),
    "more inputs than outputs": ({"ground_truth": json.dumps({"inputs": ["1", "2"], "outputs": ["1"]})}, "ground_truth"),
    "no test cases": ({"ground_truth": json.dumps({"inputs": [], "outputs": []})}, "ground_truth"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_row_that_cannot_be_rolled_out_or_graded_is_refused_when_read(tmp_path, case):
    changes, column = BAD_ROWS[case]
    rows = [CODE_PROBLEM.to_row(), CODE_PROBLEM.to_row(), {**CODE_PROBLEM.to_row(), **changes}]
    problems = problems_file(tmp_path / "eval.parquet", rows)
    completed = run_agentrl("evaluate", "export-livecodebench", "--problems", problems, "--samples", tmp_path / "s.jsonl",
                        "--out", tmp_path / "lcb.json", cwd=tmp_path)  # fmt: skip
    assert_refused(completed, "eval.parquet: row 2", f"column '{column}'")
    assert not (tmp_path / "lcb.json").exists()


GPQA_ROW = Problem(
    "g0",
    "gpqa_diamond",
    [{"role": "user", "content": "Which is a noble gas?\nA) N\nB) Ne\nC) Na\nD) Ni"}],
    "science",
    "B",
)
# name -> (the multiple-choice row's ground truth, what the message says); the verifier reads one option letter
BAD_CHOICE_ANSWERS = {
    "a word": ("Neon", "must be a single option letter"),
    "two letters": ("B, C", "must be a single option letter"),
    "a number": (2, "must be a single option letter"),
    "a letter without an option": ("E", "option letter 'E' is not one of the prompt's options (A, B, C, D)"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_CHOICE_ANSWERS))
def test_a_multiple_choice_answer_its_verifier_cannot_grade_is_refused_when_read(tmp_path, case):
    truth, fragment = BAD_CHOICE_ANSWERS[case]
    rows = [GPQA_ROW.to_row(), {**GPQA_ROW.to_row(), "id": "g1", "ground_truth": json.dumps(truth)}]
    problems = problems_file(tmp_path / "gpqa_diamond.parquet", rows)
    completed = run_agentrl("evaluate", "export-livecodebench", "--problems", problems, "--samples", tmp_path / "s.jsonl",
                        "--out", tmp_path / "lcb.json", cwd=tmp_path)  # fmt: skip
    assert_refused(completed, "gpqa_diamond.parquet: row 1", "column 'ground_truth'", fragment)
    assert not (tmp_path / "lcb.json").exists()


def test_a_multiple_choice_answer_in_the_prompts_options_is_read():
    from agentrl.rewards.ground_truth import check_ground_truths

    wrapped = Problem("g2", "gpqa_diamond", GPQA_ROW.prompt, "science", "(d)")  # the verifier reads it as D
    embedded = Problem(
        "c0", "embedded-choice", [{"role": "user", "content": "Which option equals 3+4?\nA=6, B=7, C=9"}], "math", "B"
    )
    check_ground_truths([GPQA_ROW, wrapped, embedded], "eval/gpqa_diamond")
    unlabelled = Problem("g3", "gpqa_diamond", [{"role": "user", "content": "Pick one of the four."}], "science", "D")
    check_ground_truths([unlabelled], "eval/gpqa_diamond")  # no labelled options: the letter alone is checked
    with pytest.raises(
        DataFormatError, match=r"eval/choice: row 0 \(id 'c0'\), column 'ground_truth': option letter 'D'"
    ):
        check_ground_truths([Problem("c0", "embedded-choice", embedded.prompt, "math", "D")], "eval/choice")


def test_prepare_refuses_a_bad_row_before_writing_anything(tmp_path):
    from agentrl.data.records import check_problems

    bad = Problem("p9", "embedded-arith", [{"role": "user", "content": "hi"}], "math", "   ")
    with pytest.raises(DataFormatError, match=r"rl_pool: row 1 \(id 'p9'\), column 'ground_truth': empty"):
        check_problems([CODE_PROBLEM, bad], "rl_pool")


@pytest.mark.slow
def test_sft_refuses_a_set_without_a_trained_token_before_the_model_loads(tiny_sft_workspace, tmp_path):
    user_only = [SftExample(f"s{i}", [{"role": "user", "content": f"question {i}"}], []) for i in range(8)]
    write_records(user_only, tmp_path / "sft.parquet")
    args = ["sft", "--config-json", json.dumps({"sft": {"global_batch_size": 4, "micro_batch_size": 2}})]
    args += ["--model", tiny_sft_workspace / "base", "--data", tmp_path / "sft.parquet", "--out", tmp_path / "out/sft"]
    args += ["--metrics", tmp_path / "out/metrics.jsonl", "--checkpoint-dir", tmp_path / "ck", "--nproc", "0"]
    completed = run_agentrl(*args, cwd=tmp_path)
    assert completed.returncode == 2 and "Traceback" not in completed.stderr, completed.stderr[-3000:]
    assert "sft.parquet: none of the 8 conversations has a trained token" in completed.stderr
    assert not (tmp_path / "out/sft").exists() and not (tmp_path / "out/metrics.jsonl").exists()
    assert not list((tmp_path / "ck").glob("step_*"))


def test_a_hub_model_neither_cached_nor_reachable_is_refused_naming_its_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline: the hub is not asked, the cache has no such model
    out = tmp_path / "models" / "sft"
    completed = run_agentrl("fetch-model", "--id", "nobody/no-such-model", "--revision", "v1", "--key", "sft.from",
                            "--out", out, cwd=tmp_path)  # fmt: skip
    assert_refused(completed, "sft.from='nobody/no-such-model' at revision 'v1'", "not in the local hub cache")
    assert not out.exists()


# --------------------------------------------------------------------------- hub ids that cannot be fetched
_UPSTREAM_TYPO = {"sft": {"id": "Gen-Verse/Open-AgentRL-SFT-3k", "file": "sft.parquet", "revision": "v2"}}
# name -> (stage arguments, what the message names); the hub is offline and the cache empty
HUB_UNREACHABLE = {
    "hub-download of a data set": (["hub-download", "--config-json", json.dumps({"data": {"source": "upstream", "upstream": _UPSTREAM_TYPO}}),
                                    "--manifest", "manifest.json"],
                                   "data.upstream.sft='Gen-Verse/Open-AgentRL-SFT-3k' at revision 'v2', file 'sft.parquet'"),
    "prepare-data from the hub": (["prepare-data", "--config-json", json.dumps({"data": {"source": "upstream", "upstream": _UPSTREAM_TYPO}}),
                                   "--sft", "s.parquet", "--rl-pool", "r.parquet", "--eval-dir", "e"],
                                  "data.upstream.sft='Gen-Verse/Open-AgentRL-SFT-3k' at revision 'v2'"),
    "a hub base model": (["base-model", "--config-json", json.dumps({"model": {"base": "Qwen/Qwen3-4b-Instruct"}}), "--out", "base"],
                         "model.base='Qwen/Qwen3-4b-Instruct': not in"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HUB_UNREACHABLE))
def test_a_hub_id_not_in_the_cache_while_offline_is_refused_naming_key_id_and_what_to_do(tmp_path, monkeypatch, case):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: nothing was fetched
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    args, named = HUB_UNREACHABLE[case]
    completed = run_agentrl(*args, cwd=tmp_path)
    assert_refused(completed, named, "not in the local hub cache", "HF_HUB_OFFLINE=1", "hub-download", "spelling")
    assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr
    for output in ("manifest.json", "s.parquet", "r.parquet", "base"):
        assert not (tmp_path / output).exists(), output


def _hub_answer(code: str, status: int = 404) -> Exception:
    """The error huggingface_hub raises for the hub's answer ``X-Error-Code: code`` (its own translation)."""
    import httpx2
    from huggingface_hub.utils import hf_raise_for_status

    request = httpx2.Request("GET", "https://huggingface.co/api/models/Qwen/Qwen3-4b/revision/v9")
    try:
        hf_raise_for_status(httpx2.Response(status, headers={"X-Error-Code": code}, request=request))
    except Exception as exc:  # noqa: BLE001 - the point is which kind it is
        return exc
    raise AssertionError(f"{code}: no error raised")


def test_a_hub_answer_names_the_key_and_what_to_fix():
    from agentrl.hub_ids import hub_fetch_refusal

    cases = {  # the hub's answer -> what the message says to do
        ("RepoNotFound", 404): "the hub has no such repository; check the id's spelling",
        ("GatedRepo", 403): "a gated repository; accept its terms",
        ("RevisionNotFound", 404): "no such branch, tag or commit; check the revision",
        ("EntryNotFound", 404): "no such file at that revision",
    }
    for (code, status), fragment in cases.items():
        refusal = hub_fetch_refusal(_hub_answer(code, status), "model.base", "Qwen/Qwen3-4b", "v9")
        assert refusal is not None and fragment in str(refusal), (code, refusal)
        assert str(refusal).startswith("model.base='Qwen/Qwen3-4b' at revision 'v9': "), refusal
    assert hub_fetch_refusal(KeyError("a bug"), "model.base", "Qwen/Qwen3-4b", None) is None, (
        "a bug keeps its traceback"
    )


# --------------------------------------------------------------------------- model folders that cannot be used
def _unusable(folder: Path, case: str) -> list[str]:
    """Break a real model folder as ``case`` says; returns what the message must name."""
    if case == "no chat template":
        (folder / "chat_template.jinja").unlink()  # transformers would fail at the first chat it renders
        return ["no chat template", "chat_template.jinja"]
    config = json.loads((folder / "config.json").read_text())
    key, value, named = {
        "intermediate_size": ("intermediate_size", 2 * config["intermediate_size"], "mlp.down_proj.weight"),
        "vocab_size": ("vocab_size", config["vocab_size"] + 8, "model.embed_tokens.weight"),
        "layer count": ("num_hidden_layers", config["num_hidden_layers"] + 1, "the weights hold layers 0..1 (2)"),
    }[case]
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    return ["config.json does not match the weights", key, named]


@pytest.mark.parametrize("case", ["no chat template", "intermediate_size", "vocab_size", "layer count"])
@pytest.mark.parametrize("stage", ["base-model", "sft"])
def test_a_model_folder_that_cannot_be_used_is_refused_when_read(random_policy_dir, tmp_path, case, stage):
    import shutil

    folder = Path(shutil.copytree(random_policy_dir, tmp_path / "policy"))
    fragments = _unusable(folder, case)
    if stage == "base-model":  # model.base a local folder: linked into results/models/base/
        args = ["base-model", "--config-json", json.dumps({"model": {"base": str(folder)}}), "--out", tmp_path / "base"]
        absent = [tmp_path / "base", tmp_path / "base.tmp"]
    else:
        rows = [SftExample(f"s{i}", SFT_EXAMPLE.messages, []).to_row() for i in range(8)]  # one batch: it would train
        data = problems_file(tmp_path / "sft.parquet", rows)
        args, absent = sft_command(tmp_path, folder, data), [tmp_path / "out/sft", tmp_path / "out/metrics.jsonl"]
    completed = run_agentrl(*args, cwd=tmp_path)
    assert_refused(completed, str(folder), *fragments)
    assert "Loading" not in completed.stderr, "refused before the model loaded"
    for path in absent:
        assert not path.exists(), path


# --------------------------------------------------------------------------- blank prompts in upstream rows
_SFT_ROW = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "tools": "[]"}
_RL_ROW = {
    "prompt": [{"role": "user", "content": "1+1?"}],
    "data_source": "aime2024",
    "reward_model": {"ground_truth": "2"},
}
_AIME_ROW = {"Problem": "What is 1+1?", "Answer": "2"}
# name -> (the file given a blank third row, its changed columns, the column named)
BLANK_PROMPTS = {
    "an empty RL prompt": ("rl", {"prompt": [{"role": "user", "content": ""}]}, "prompt"),
    "a whitespace RL prompt": ("rl", {"prompt": [{"role": "user", "content": " \n\t "}]}, "prompt"),
    "a whitespace eval question": ("aime2024", {"Problem": "   "}, "Problem"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BLANK_PROMPTS))
def test_a_blank_prompt_is_refused_when_data_is_prepared(tmp_path, case):
    blank_in, changes, column = BLANK_PROMPTS[case]
    rows = {"sft": [_SFT_ROW], "rl": [_RL_ROW] * 3, "aime2024": [_AIME_ROW] * 3}
    rows[blank_in] = [*rows[blank_in][:2], {**rows[blank_in][2], **changes}]
    for name, table in rows.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in table))
    upstream = {name: {"id": str(tmp_path / f"{name}.jsonl")} for name in ("sft", "rl")}
    data = {
        "source": "upstream",
        "upstream": {**upstream, "eval": {"aime2024": {"id": str(tmp_path / "aime2024.jsonl")}}},
    }
    out = tmp_path / "prepared"
    completed = run_agentrl("prepare-data", "--config-json", json.dumps({"data": data}), "--sft", out / "sft.parquet",
                            "--rl-pool", out / "rl_pool.parquet", "--eval-dir", out / "eval", cwd=tmp_path)  # fmt: skip
    assert_refused(completed, f"{blank_in}.jsonl: row 2, column '{column}'", "blank (empty or whitespace)")
    assert [p for p in out.rglob("*") if p.is_file()] == [], "nothing written"


# --------------------------------------------------------------------------- a response budget below the overlong window
# name -> (config file, fragments of the message)
OVERLONG_WINDOWS = {
    "budget below the buffer": (
        "rollout:\n  max_response_tokens: 100\n",  # max_response_length follows it; the buffer is 128
        ["reward.overlong.buffer_length (128) exceeds the response budget, rollout.max_response_tokens"],
    ),
    "budget below max_response_length": (
        "rollout:\n  max_response_tokens: 256\nreward:\n  overlong: {max_response_length: 512}\n",
        ["rollout.max_response_tokens (256) is below reward.overlong.max_response_length (512)"],
    ),
}


@pytest.mark.parametrize("case", sorted(OVERLONG_WINDOWS))
def test_a_stage_run_alone_refuses_a_budget_below_the_overlong_window(tmp_path, case):
    content, fragments = OVERLONG_WINDOWS[case]
    (tmp_path / "budget.yaml").write_text(content)
    problems = problems_file(tmp_path / "eval.parquet", [CODE_PROBLEM.to_row()])
    completed = run_agentrl("evaluate", "run", "--config", "budget.yaml", "--model", fake_model(tmp_path / "model"),
                            "--problems", problems, "--samples", "s.jsonl", "--metrics", "m.json", cwd=tmp_path)  # fmt: skip
    assert_refused(completed, "budget.yaml: ", *fragments)
    assert not (tmp_path / "s.jsonl").exists() and not (tmp_path / "m.json").exists()


def test_a_hub_snapshot_that_cannot_be_used_is_refused_before_it_is_linked(random_policy_dir, tmp_path, monkeypatch):
    """A cached hub model is checked as a local folder is: here its tokenizer has no chat template."""
    import shutil

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--base-model"
    snapshot = Path(shutil.copytree(random_policy_dir, repo / "snapshots" / commit))
    (snapshot / "chat_template.jinja").unlink()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "models" / "base"
    completed = run_agentrl("base-model", "--config-json", json.dumps({"model": {"base": "org/base-model"}}),
                            "--out", out, cwd=tmp_path)  # fmt: skip
    assert_refused(completed, "model.base='org/base-model' (hub snapshot)", "no chat template")
    assert not out.exists() and not out.with_name("base.tmp").exists()
