"""The code grader cannot be fooled: each known trick scores as a failure, for every kind of test.

A pass must mean that the test ran to its end: an exit status 0 pays nothing by itself. The
tricks (``os._exit(0)``, ``sys.exit(0)``, ``atexit`` hooks that exit 0 or re-exec, exiting 0 from
``sys.excepthook``, ``threading.excepthook``, a finalizer, a signal handler or a replaced
``__build_class__``, a trace function, always-equal return values, writing the pass line to every
descriptor, reaching the checker's stdout through ``/proc``, signalling the checker; and the
regression guards that never fooled the old grader: a redefined ``check`` or ``AssertionError``,
patched builtins) are each run against stdin, functional and LeetCode ground truths in the real
sandbox; test_old_grader_judgement_of_each_trick shows which of them the old exit-status grader
paid. LeetCode rows get upstream's credit per assert (``test_code`` split into lines, one program
per assert): a solution right on 3 of 4 asserts scores 0.75 with or without a trick added.
"""

from __future__ import annotations

import pytest

from agentrl.config import load_config
from agentrl.data.records import Problem
from agentrl.rewards import InvalidGroundTruthError, RewardFunction
from agentrl.rewards.code_verifier import parse_code_tests
from agentrl.rewards.leetcode_harness import PASSED
from agentrl.tools.sandbox import LocalSandbox

NO_SHAPING = {"overlong": {"enable": False}, "tool_call_shaping": {"enable": False, "correct_bonus": False}}

STDIO = {"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]}
STDIO_WRONG = "print(0)\n"
FUNCTIONAL = {"fn_name": "maxValue", "inputs": ["[1, 5, 3]", "[-2]"], "outputs": ["5", "-2"]}
FUNCTIONAL_WRONG = "class Solution:\n    def maxValue(self, nums):\n        return 0\n"
LEETCODE = {
    "entry_point": "Solution().maxValue",
    "import_prefix": "from typing import List\n",
    "test_code": (
        "def check(candidate):\n"
        "    assert candidate([1, 5, 3]) == 5\n"
        "    assert candidate([-2]) == -2\n"
        "    assert candidate([4, 4]) == 4\n"
        "    assert candidate(nums=[0, 9]) == 9\n"
    ),
}
LEETCODE_WRONG = "class Solution:\n    def maxValue(self, nums: List[int]) -> int:\n        return 0\n"
# Right on the first three asserts, wrong on [0, 9]: upstream's per-assert credit gives 0.75.
LEETCODE_THREE_OF_FOUR = "class Solution:\n    def maxValue(self, nums: List[int]) -> int:\n        return 0 if nums == [0, 9] else max(nums)\n"

# Each trick is prepended to a wrong (or 3-of-4) solution. "Old:" says whether the exit-status
# grader this one replaced (commit aab7ac0^: `import_prefix + solution + test_code + check(...)` as
# one program, a LeetCode row passing when it exited 0) paid the wrong solution with it;
# test_old_grader_judgement_of_each_trick checks every such claim. Stdin and functional cases were
# judged by their output there too, so no trick paid on them: they guard the output checks.
TRICKS = {
    # Old: paid (exits 0 before the check runs).
    "os._exit": "import os\nos._exit(0)\n",
    # Old: paid (SystemExit(0) at module level is exit status 0).
    "sys.exit": "import sys\nsys.exit(0)\n",
    # Old: paid (the failed assert sets status 1, then the hook exits 0).
    "atexit": "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    # Old: paid (the hook replaces the failing process by a fresh interpreter that exits 0).
    "atexit-re-execs": "import atexit, os, sys\natexit.register(os.execv, sys.executable, [sys.executable, '-c', ''])\n",
    # Old: paid (the interpreter reports the failed assert through sys.excepthook, which exits 0).
    "excepthook-exits-0": "import os, sys\nsys.excepthook = lambda *exc: os._exit(0)\n",
    # Old: paid (at exit the interpreter joins the thread; its exception goes to threading.excepthook).
    "threading-excepthook-exits-0": (
        "import os, threading, time\n"
        "threading.excepthook = lambda args: os._exit(0)\n"
        "def _raise_later():\n"
        "    time.sleep(0.3)\n"
        "    raise RuntimeError('late')\n"
        "threading.Thread(target=_raise_later).start()\n"
    ),
    # Old: paid (weakref.finalize runs its callback at exit, after the failed assert).
    "finalizer-exits-0": (
        "import os, weakref\nclass _Anchor:\n    pass\n_anchor = _Anchor()\nweakref.finalize(_anchor, os._exit, 0)\n"
    ),
    # Old: paid (a thread keeps the failed process alive until the alarm's handler exits 0).
    "signal-handler-exits-0": (
        "import os, signal, threading, time\n"
        "signal.signal(signal.SIGALRM, lambda *args: os._exit(0))\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.5)\n"
        "threading.Thread(target=time.sleep, args=(3,)).start()\n"
    ),
    # Old: paid (the solution's own `class Solution` statement exits 0).
    "build-class-exits-0": "import builtins, os\nbuiltins.__build_class__ = lambda *a, **k: os._exit(0)\n",
    # Old: paid (every method of every later class returns an object equal to anything: asserts hold).
    "build-class-always-equal": (
        "import builtins\n"
        "class _Equal:\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "_build_class = builtins.__build_class__\n"
        "def _always_equal_class(*args, **kwargs):\n"
        "    cls = _build_class(*args, **kwargs)\n"
        "    for name, value in list(vars(cls).items()):\n"
        "        if callable(value) and not name.startswith('__'):\n"
        "            setattr(cls, name, lambda *a, **k: _Equal())\n"
        "    return cls\n"
        "builtins.__build_class__ = _always_equal_class\n"
    ),
    # Old: paid (a trace function turns the first line of check into SystemExit(0)).
    "settrace-skips-lines": (
        "import sys\n"
        "def _skip(frame, event, arg):\n"
        "    if event == 'line' and frame.f_code.co_name == 'check':\n"
        "        raise SystemExit(0)\n"
        "    return _skip\n"
        "sys.settrace(_skip)\n"
    ),
    # Old: paid (exits 0); the pass line goes to every channel the process holds: stdout, stderr,
    # /proc/self/fd/1 and 2, every other open descriptor (the harness's pipes), fd 2 dup2'ed onto 1.
    "pass-line-everywhere-then-exit": (
        "import os\n"
        f"_line = b{(PASSED + chr(10))!r}\n"
        "for _fd in range(1, 64):\n"
        "    try:\n"
        "        os.write(_fd, _line)\n"
        "    except OSError:\n"
        "        pass\n"
        "for _path in ('/proc/self/fd/1', '/proc/self/fd/2'):\n"
        "    try:\n"
        "        with open(_path, 'wb') as _fh:\n"
        "            _fh.write(_line)\n"
        "    except OSError:\n"
        "        pass\n"
        "os.dup2(2, 1)\n"
        "os.write(1, _line)\n"
        f"print({PASSED!r}, flush=True)\n"
        "os._exit(0)\n"
    ),
    # Old: paid (exits 0 after writing the verdict line where the checker's stdout would be).
    "prints-pass-line-then-exits": f"import os, sys\nprint({PASSED!r}, flush=True)\nos._exit(0)\n",
    # Regression guards: the old grader did not pay these either (exit status 1 after the failed assert).
    # Old: not paid (the hook prints, the exit status stays 1).
    "atexit-prints-pass": f"import atexit\natexit.register(lambda: print({PASSED!r}))\n",
    # Old: not paid (the row's own `def check` comes after the solution and replaces this one).
    "redefine-check": "def check(candidate):\n    return None\n",
    # Old: not paid (since Python 3.9 `assert` raises the real AssertionError, whatever the name means).
    "redefine-AssertionError": (
        "import builtins\nclass AssertionError(Exception):\n    pass\nbuiltins.AssertionError = AssertionError\n"
    ),
    # Old: not paid (as above: `assert` never looks the name up; SystemExit would have meant status 0).
    "builtins-AssertionError-is-SystemExit": "import sys\nsys.modules['builtins'].AssertionError = SystemExit\n",
    # Old: not paid (the wrong answer stays wrong).
    "patch-builtins": "import builtins\nbuiltins.max = lambda *a, **k: 0\nbuiltins.print = lambda *a, **k: None\n",
    # Old: not paid (stdout was not read; the exit status stays 1).
    "prints-pass-line": f"import os\nos.write(1, b{(PASSED + chr(10))!r})\nprint({PASSED!r})\n",
    # Old: not paid (no checker; the parent's descriptors are closed to the sandboxed code).
    "writes-checker-stdout": (
        "import os\n"
        "try:\n"
        f"    os.write(os.open(f'/proc/{{os.getppid()}}/fd/1', os.O_WRONLY), b{(PASSED + chr(10))!r})\n"
        "except OSError:\n"
        "    pass\n"
    ),
    # Old: not paid (the parent was the sandbox's, of another uid: PermissionError, exit status 1).
    "kills-checker": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    # Old: not paid (as above). Here the parent is the checker: a KeyboardInterrupt or SIGTERM there
    # ends it before its verdict.
    "interrupts-checker": "import os, signal\nos.kill(os.getppid(), signal.SIGINT)\nos.kill(os.getppid(), signal.SIGTERM)\n",
    # Old: not paid (the whole group, this program included, dies of SIGKILL).
    "kills-own-group": "import os, signal\nos.killpg(0, signal.SIGKILL)\n",
}
# The tricks the old grader paid on a LeetCode row (each entry above says why).
FOOLED_THE_OLD_GRADER = {
    "os._exit",
    "sys.exit",
    "atexit",
    "atexit-re-execs",
    "excepthook-exits-0",
    "threading-excepthook-exits-0",
    "finalizer-exits-0",
    "signal-handler-exits-0",
    "build-class-exits-0",
    "build-class-always-equal",
    "settrace-skips-lines",
    "pass-line-everywhere-then-exit",
    "prints-pass-line-then-exits",
}
# Whole solutions whose return value does the trick (one per kind of ground truth; a stdin
# program has no return value, so its variant is the object's finalizer at the end of the program).
# Old: paid on LeetCode (the returned int's __del__ runs as soon as `candidate(x) == 5` is
# evaluated, before the assert can raise, and exits 0).
RETURN_VALUE_EXITS_0 = (
    "import os\n"
    "class _Exit(int):\n"
    "    def __del__(self):\n"
    "        os._exit(0)\n"
    "class Solution:\n"
    "    def maxValue(self, nums):\n"
    "        return _Exit(0)\n"
)
STDIO_FINALIZER_EXITS_0 = (
    "import os\nclass _Exit:\n    def __del__(self):\n        os._exit(0)\nprint(0)\n_x = _Exit()\ndel _x\n"
)
ALWAYS_EQUAL = "class _Equal:\n    def __eq__(self, other):\n        return True\n"
ALWAYS_EQUAL_INT = "class _Equal(int):\n    def __eq__(self, other):\n        return True\n"


CFG = load_config({"reward": {**NO_SHAPING, "code_case_timeout_s": 5}, "sandbox": {"workers": 2}})


@pytest.fixture(scope="module")
def sandbox():
    with LocalSandbox(CFG.sandbox) as running:
        yield running


@pytest.fixture(scope="module")
def reward_fn(sandbox):
    return RewardFunction(CFG.reward, sandbox)


def score(reward_fn, ground_truth, code, source="train-code-leetcode-Medium"):
    response = f"My solution:\n```python\n{code}\n```\n"
    result = reward_fn.score(Problem("p", source, [], "", ground_truth), response, response_length=0, num_tool_calls=0)
    return result.score, result.details


@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_tricks_fail_on_stdin_tests(reward_fn, trick):
    value, details = score(reward_fn, STDIO, TRICKS[trick] + STDIO_WRONG, source="embedded-code")
    assert value == 0.0, details


@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_tricks_fail_on_functional_tests(reward_fn, trick):
    value, details = score(reward_fn, FUNCTIONAL, TRICKS[trick] + FUNCTIONAL_WRONG, source="LiveCodeBench_v6")
    assert value == 0.0, details


@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_tricks_fail_on_leetcode_tests(reward_fn, trick):
    value, details = score(reward_fn, LEETCODE, TRICKS[trick] + LEETCODE_WRONG)
    assert value == 0.0, details


def old_grader_program(ground_truth: dict, code: str) -> str:
    """The one program the exit-status grader (aab7ac0^) ran for a LeetCode row; it paid exit status 0."""
    truth = ground_truth
    return f"{truth['import_prefix']}\n{code}\n\n{truth['test_code']}\n\ncheck({truth['entry_point']})\n"


def test_old_grader_judgement_of_each_trick(sandbox):
    """The claims of the TRICKS table: the listed tricks made the wrong solution exit 0 under the
    old grader (a pass there), the regression guards did not. The wrong solution alone exits 1."""
    cases = {"none": LEETCODE_WRONG, **{name: TRICKS[name] + LEETCODE_WRONG for name in TRICKS}}
    cases["return-value-exits-0"] = RETURN_VALUE_EXITS_0
    cases["always-equal"] = ALWAYS_EQUAL + "class Solution:\n    def maxValue(self, nums):\n        return _Equal()\n"
    jobs = [(old_grader_program(LEETCODE, code), None) for code in cases.values()]
    paid = {
        name for name, result in zip(cases, sandbox.run_many(jobs, timeout_s=CFG.reward.code_case_timeout_s))
        if result.status == "ok"
    }  # fmt: skip
    assert paid == FOOLED_THE_OLD_GRADER | {"return-value-exits-0", "always-equal"}


def test_return_values_and_finalizers_that_exit_0_fail(reward_fn):
    """The returned value's __del__ runs in the solution's process (LeetCode) or after the result
    line is printed (functional); a stdin program's finalizer exits before its output is flushed."""
    leetcode = score(reward_fn, LEETCODE, RETURN_VALUE_EXITS_0)
    assert leetcode[0] == 0.0, leetcode[1]
    functional = score(reward_fn, FUNCTIONAL, RETURN_VALUE_EXITS_0, source="LiveCodeBench_v6")
    assert functional[0] == 0.0, functional[1]
    stdio = score(reward_fn, STDIO, STDIO_FINALIZER_EXITS_0, source="embedded-code")
    assert stdio[0] == 0.0, stdio[1]


@pytest.mark.parametrize(
    "trick",
    ["atexit", "atexit-prints-pass", "redefine-check", "prints-pass-line", "excepthook-exits-0", "finalizer-exits-0",
     "atexit-re-execs"],
)  # fmt: skip
def test_a_trick_adds_nothing_to_upstreams_per_assert_credit(reward_fn, trick):
    """Tricks that leave the solution able to answer: the score is what the answers earn, 3 of 4."""
    assert score(reward_fn, LEETCODE, LEETCODE_THREE_OF_FOUR)[0] == pytest.approx(0.75)
    value, details = score(reward_fn, LEETCODE, TRICKS[trick] + LEETCODE_THREE_OF_FOUR)
    assert value == pytest.approx(0.75), details
    assert details["case_outcomes"][:3] == ["pass"] * 3


@pytest.mark.parametrize("equal_class", [ALWAYS_EQUAL, ALWAYS_EQUAL_INT], ids=["object", "int-subclass"])
def test_always_equal_return_values_fail(reward_fn, equal_class):
    leetcode = equal_class + "class Solution:\n    def maxValue(self, nums):\n        return _Equal()\n"
    assert score(reward_fn, LEETCODE, leetcode)[0] == 0.0
    functional = equal_class + "class Solution:\n    def maxValue(self, nums):\n        return _Equal()\n"
    assert score(reward_fn, FUNCTIONAL, functional, source="LiveCodeBench_v6")[0] == 0.0


def test_leetcode_credit_is_per_assert_line_as_upstream(reward_fn):
    tests = parse_code_tests(LEETCODE)
    assert len(tests) == 4
    value, details = score(reward_fn, LEETCODE, LEETCODE_THREE_OF_FOUR)
    assert value == pytest.approx(0.75)
    assert details["case_outcomes"] == ["pass", "pass", "pass", "wrong_answer"]
    assert "AssertionError" in details["first_failure"]["stderr"]
    right = "class Solution:\n    def maxValue(self, nums: List[int]) -> int:\n        return max(nums)\n"
    assert score(reward_fn, LEETCODE, right)[0] == 1.0


LINKED_LIST_PREFIX = """\
from typing import List, Optional
class ListNode:
    def __init__(self, val=0, next=None):
        self.val = val
        self.next = next
def list_node(values):
    head = None
    for value in reversed(values):
        head = ListNode(value, head)
    return head
def is_same_list(a, b):
    while a and b:
        if a.val != b.val:
            return False
        a, b = a.next, b.next
    return a is None and b is None
"""


def test_leetcode_objects_and_in_place_changes_cross_the_process_boundary(reward_fn):
    """ListNode arguments and results travel as the prefix's class; an in-place change is seen."""
    truth = {
        "entry_point": "Solution().reverseList",
        "import_prefix": LINKED_LIST_PREFIX,
        "test_code": (
            "def check(candidate):\n"
            "    assert is_same_list(candidate(head=list_node([1, 2, 3])), list_node([3, 2, 1]))\n"
            "    assert is_same_list(candidate(list_node(list(range(3000)))), list_node(list(range(2999, -1, -1))))\n"
            "    assert candidate(head=None) is None\n"
        ),
    }
    solution = (
        "class Solution:\n"
        "    def reverseList(self, head: Optional[ListNode]) -> Optional[ListNode]:\n"
        "        previous = None\n"
        "        while head:\n"
        "            head.next, previous, head = previous, head, head.next\n"
        "        return previous\n"
    )
    value, details = score(reward_fn, truth, solution)
    assert value == 1.0, details
    in_place = {
        "entry_point": "Solution().sortColors",
        "import_prefix": "from typing import List\n",
        "test_code": "def check(candidate):\n    nums = [2, 0, 1]; candidate(nums); assert nums == [0, 1, 2]\n",
    }
    sort_in_place = "class Solution:\n    def sortColors(self, nums: List[int]) -> None:\n        nums.sort()\n"
    assert score(reward_fn, in_place, sort_in_place)[0] == 1.0
    assert score(reward_fn, in_place, sort_in_place.replace("nums.sort()", "sorted(nums)"))[0] == 0.0


def test_leetcode_ground_truth_without_an_assert_line_is_invalid():
    with pytest.raises(InvalidGroundTruthError, match="at least one assert"):
        parse_code_tests({**LEETCODE, "test_code": "def check(candidate):\n"})


# The shape of the released RL pool's LeetCode rows (LeetCodeDataset's import_prefix): star imports
# of the standard library, then ListNode / TreeNode and their helpers.
UPSTREAM_STYLE_PREFIX = """\
import random
import functools
import collections
import string
import math
import datetime

from typing import *
from functools import *
from collections import *
from itertools import *
from heapq import *
from bisect import *
from string import *
from operator import *
from math import *

inf = float('inf')

class TreeNode:
    def __init__(self, val=0, left=None, right=None):
        self.val = val
        self.left = left
        self.right = right

def tree_node(values: list):
    if not values:
        return None
    root = TreeNode(values[0])
    i = 1
    queue = deque()
    queue.append(root)
    while queue:
        node = queue.popleft()
        if i < len(values) and values[i] is not None:
            node.left = TreeNode(values[i])
            queue.append(node.left)
        i += 1
        if i < len(values) and values[i] is not None:
            node.right = TreeNode(values[i])
            queue.append(node.right)
        i += 1
    return root

def is_same_tree(p, q):
    if not p and not q:
        return True
    elif not p or not q:
        return False
    elif p.val != q.val:
        return False
    else:
        return is_same_tree(p.left, q.left) and is_same_tree(p.right, q.right)
"""


def test_an_upstream_style_row_with_trees_and_star_imports(reward_fn):
    truth = {
        "entry_point": "Solution().invertTree",
        "import_prefix": UPSTREAM_STYLE_PREFIX,
        "test_code": (
            "def check(candidate):\n"
            "    assert is_same_tree(candidate(root = tree_node([4,2,7,1,3,6,9])), tree_node([4,7,2,9,6,3,1]))\n"
            "    assert is_same_tree(candidate(root = tree_node([2,1,3])), tree_node([2,3,1]))\n"
            "    assert candidate(root = tree_node([])) is None\n"
        ),
    }
    solution = (
        "class Solution:\n"
        "    def invertTree(self, root: Optional[TreeNode]) -> Optional[TreeNode]:\n"
        "        if root:\n"
        "            root.left, root.right = self.invertTree(root.right), self.invertTree(root.left)\n"
        "        return root\n"
    )
    value, details = score(reward_fn, truth, solution)
    assert value == 1.0, details
    counter = {
        "entry_point": "Solution().count",
        "import_prefix": UPSTREAM_STYLE_PREFIX,
        "test_code": "def check(candidate):\n    assert candidate('abca') == {'a': 2, 'b': 1, 'c': 1}\n",
    }
    returns_counter = "class Solution:\n    def count(self, s: str):\n        return Counter(s)\n"
    assert score(reward_fn, counter, returns_counter)[0] == 1.0  # a standard container is data


def test_numpy_values_and_defaultdicts_count_as_their_plain_values(reward_fn):
    """Upstream compares them in one process (numpy.int64(5) == 5): the same answers pass here."""
    truth = {**LEETCODE, "test_code": "def check(candidate):\n    assert candidate([1, 5, 3]) == 5\n"}
    numpy_int = "import numpy\nclass Solution:\n    def maxValue(self, nums):\n        return numpy.max(nums)\n"
    assert score(reward_fn, truth, numpy_int)[0] == 1.0
    counts = {**LEETCODE, "test_code": "def check(candidate):\n    assert candidate([1, 1]) == {1: 2}\n"}
    default = (
        "from collections import defaultdict\nclass Solution:\n    def maxValue(self, nums):\n"
        "        d = defaultdict(lambda: 0)\n        for x in nums:\n            d[x] += 1\n        return d\n"
    )
    assert score(reward_fn, counts, default)[0] == 1.0


READS_THE_TEST = r"""
import gc, re
texts = []
for name in ("main.py", "/proc/self/cmdline", "/dev/stdin"):
    try:
        texts.append(open(name).read())
    except OSError:
        pass
for obj in gc.get_objects():  # strings held by code constants, dicts and lists of this process
    if isinstance(obj, (tuple, list)):
        texts += [x for x in obj if isinstance(x, str)]
    elif isinstance(obj, dict):
        texts += [x for x in obj.values() if isinstance(x, str)]
answers = {}
for text in texts:
    for args, value in re.findall(r"candidate\((?:nums=)?(\[[^\]]*\])\) == (-?\d+)", text):
        answers[args.replace(" ", "")] = int(value)
class Solution:
    def maxValue(self, nums):
        return answers.get(str(nums).replace(" ", ""), 0)
"""


def test_the_expected_values_are_out_of_the_solutions_reach(reward_fn):
    """The test reaches the checker on its stdin after the solution's process was forked: not in
    main.py, not in the solution's memory, not on its stdin."""
    value, details = score(reward_fn, LEETCODE, READS_THE_TEST)
    assert value == 0.0, details
