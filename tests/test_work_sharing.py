"""Sharing a GRPO step's work over the ranks (agentrl.grpo.work_sharing): the claim queue on the
process group's real store (two torchrun processes, gloo), the assignment of a mini-batch's
samples, and the exchange that moves only what changes rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.grpo.work_sharing import assign_units, fixed_positions, select_groups

# Two ranks on the real store: rank 1 pauses after each claim, so rank 0 claims more; then the
# samples of three groups per rank go through distribute() with and without balancing.
WORKER = """
import json, sys, time
from agentrl.grpo.work_sharing import ClaimQueue, SampleInfo, distribute, queue_store
from agentrl.training import deepspeed_engine as dse

ctx = dse.init_distributed(2.0)
store, token = queue_store(ctx)
queue = ClaimQueue(store, token, "step1-round0", 40)
claimed = []
for position in queue:
    claimed.append(position)
    time.sleep(0.05 if ctx.rank == 1 else 0.005)
again = list(ClaimQueue(store, token, "step1-round0", 40))  # the counter stays past the end

# Rank r rolled out groups (0, r), (0, r + 2), (0, r + 4) (the fixed split), 2 samples each; a
# sample's cost is its length, long on rank 0.
keys = [(0, k * 2 + ctx.rank) for k in range(3)]
local = {(key, i): f"sample {key[1]}.{i}" for key in keys for i in range(2)}
cost = {(key, i): (50 if ctx.rank == 0 else 5) + key[1] + i for key in keys for i in range(2)}
infos = [SampleInfo(key, i, cost[(key, i)]) for key, i in local]
step_keys = [(0, p) for p in range(6)]
minis = [step_keys[:4], step_keys[4:]]
out = {}
for name, by_group, balance in (("fixed", False, False), ("balanced", False, True), ("groups", True, True)):
    out[name] = distribute(ctx, local, infos, minis, by_group=by_group, balance=balance)
costs = {f"{k[1]}.{i}": c for (k, i), c in cost.items()}
json.dump({"claimed": claimed, "again": again, "local": sorted(local.values()), "costs": costs, **out},
          open(f"{sys.argv[1]}.{ctx.rank}", "w"))
dse.close_distributed()
"""


def _two_ranks(tmp_path: Path) -> list[dict]:
    script, out = tmp_path / "worker.py", tmp_path / "result"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    done = subprocess.run(
        [*command, str(out)], env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return _two_ranks(tmp_path_factory.mktemp("work-sharing"))


def test_the_queue_hands_every_position_out_once_and_the_faster_rank_takes_more(ranks):
    claimed = [r["claimed"] for r in ranks]
    assert sorted(claimed[0] + claimed[1]) == list(range(40))
    assert all(c == sorted(c) for c in claimed), "each rank's claims come in queue order"
    assert len(claimed[0]) > 2 * len(claimed[1]) > 0, claimed
    assert ranks[0]["again"] == ranks[1]["again"] == [], "a drained queue hands out nothing more"


def test_without_balancing_groups_stay_on_the_rank_that_rolled_them_out(ranks):
    for rank, result in enumerate(ranks):
        fixed = result["fixed"]
        assert sorted(s for mini in fixed for s in mini) == result["local"], rank
        # mini-batch 0 is step groups 0-3, mini-batch 1 groups 4-5, in step order
        assert fixed == [
            [f"sample {g}.{i}" for g in (rank, rank + 2) for i in range(2)],
            [f"sample {4 + rank}.{i}" for i in range(2)],
        ]


@pytest.mark.parametrize("mode", ["balanced", "groups"])
def test_balancing_moves_samples_to_equal_loads_and_keeps_every_sample_once(ranks, mode):
    costs = ranks[0]["costs"] | ranks[1]["costs"]
    got = [r[mode] for r in ranks]
    every = sorted(s for rank in got for mini in rank for s in mini)
    assert every == sorted(ranks[0]["local"] + ranks[1]["local"])
    for m in range(2):
        mine = [[s.removeprefix("sample ") for s in rank[m]] for rank in got]
        assert abs(len(mine[0]) - len(mine[1])) <= (2 if mode == "groups" else 1), mine
        if mode == "groups":  # whole groups: both samples of a group on one rank
            for rank in mine:
                assert {s.split(".")[0] for s in rank} == {s.split(".")[0] for s in rank if s.endswith(".0")}
        loads = [sum(costs[s] for s in rank) for rank in mine]
        fixed = [sum(costs[s.removeprefix("sample ")] for s in rank["fixed"][m]) for rank in ranks]
        assert max(loads) - min(loads) <= max(fixed) - min(fixed), (m, loads, fixed)
        if mode == "balanced" or m == 0:  # mini-batch 1's two groups cannot be evened out whole
            assert max(loads) - min(loads) < max(fixed) - min(fixed), (m, loads, fixed)


def test_assignment_by_load_fills_the_lightest_rank_up_to_equal_counts():
    costs = [100, 90, 10, 10, 5, 5]
    ranks = assign_units(costs, [0, 0, 1, 1, 2, 2], 2, balance=True)
    assert ranks == [0, 1, 1, 0, 1, 0]  # 100 -> 0; 90 -> 1; 10 -> 1 (90 < 100); 10 -> 0; 5 -> 1; 5 -> 0
    assert [ranks.count(r) for r in (0, 1)] == [3, 3]
    assert assign_units(costs, [0, 0, 1, 1, 2, 2], 2, balance=False) == [0, 0, 1, 1, 0, 0]
    assert assign_units([1, 1, 1], [0, 1, 2], 4, balance=True) == [0, 1, 2]


def test_the_step_takes_the_first_kept_groups_in_round_and_position_order_whichever_rank_holds_them():
    assert select_groups([[(1, 3), (0, 2)], [(0, 0), (1, 0), (0, 5)]], 3) == [(0, 0), (0, 2), (0, 5)]
    assert select_groups([[(0, 1)], []], 4) == [(0, 1)]  # dynamic sampling short of the batch
    assert fixed_positions(7, 1, 3) == [1, 4]
