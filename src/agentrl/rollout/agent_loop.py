"""The multi-turn agent loop: generate, call the code interpreter, append its answer, repeat.

Recipe (docs/recipe.md section 3, upstream verl's tool agent loop as the demystify scripts run it):
the prompt is the problem's chat messages rendered by the tokenizer's chat template with the
``code_interpreter`` tool schema; each assistant turn is generated; if it holds a tool call, the
first call is run and its output comes back as a ``<tool_response>`` user turn (loss mask 0),
and generation goes on; a trajectory ends on a turn without a tool call (``stop``), after
``rollout.max_turns`` assistant turns (``max_turns``), or when its response budget
``rollout.max_response_tokens`` is spent, tool tokens included (``length``). A malformed call is
answered with ``"Error when executing tool: ..."`` and the trajectory goes on
(``rollout.tool_call_parsing: lenient``); with ``upstream`` a call verl's parser would drop
ends the trajectory (``stop``, the turn closed by the end-of-turn token, mask 0), as upstream's
loop does when it finds no call (:mod:`agentrl.rollout.tool_parser`). ``rollout.tool_turn_framing``
says whether the newline after that end-of-turn token is there (``template``) or not
(``upstream``, verl appends the tool turn right after ``<|im_end|>``).

Self-contained reasoning (``tools=False``, the no-tool half of the model card's table): the
prompt is rendered without the tool schema, generation stops only at the end of the turn, and
every trajectory is one assistant turn: a ``<tool_call>`` the model writes is text of its answer,
never parsed or run (the loop holds no interpreter and no tool-turn framing).

Context: no request is longer than :func:`agentrl.rollout.context.context_tokens` (the engine's
``max_model_len``; the smaller of the two when the engine has its own). Each turn may generate
what the budget has left and what the context has left, whichever is less; a trajectory whose
next turn would not fit after a tool response ends ``length``, as at the budget, and is scored
as any truncated response. With the context that function computes this never binds for a
prompt ``fit-prompts`` kept; it keeps a prompt that renders longer than measured from failing
the engine (vLLM refuses a request of ``max_model_len`` tokens).

Scheduling (``rollout.scheduling``):
- ``per_trajectory`` (default; upstream's asynchronous agent loop, one coroutine per
  trajectory): every trajectory is a chain of engine requests (:class:`engine.Request`, one per
  turn, all of one trajectory in one ``session``). When a turn ends in a tool call, the call runs
  in the sandbox's pool while the engine keeps decoding the others, and the next turn is queued
  as soon as the tool returns. The ``hf`` engine continues the session's cached keys and values;
  vLLM's prefix cache does the same by content.
- ``per_turn``: every turn, the live trajectories of the whole call generate together (one
  ``engine.generate``), then the tool calls of all of them run concurrently
  (``CodeInterpreter.execute_many``): each turn waits for its slowest sample and the engine
  idles while tools run.
Both give every turn the same seed (:func:`turn_seed`), so they sample the same trajectories up
to float round-off in the logits.

Deliberate departures from upstream, and why:
- Generation stops at ``</tool_call>`` as well as at the end of turn, and the loop then closes
  the turn itself (the template's ``<|im_end|>``, loss mask 0). Upstream generates to
  ``<|im_end|>`` and parses the calls out of the whole turn; since only the first call is run,
  whatever the model writes after it (further calls, a hallucinated tool response) would be
  trained on although it never took effect. Stopping there saves those tokens; the price is
  that the ``<|im_end|>`` closing a tool-call turn is not trained in RL (SFT trains it), and
  that the text after the first call, which upstream keeps in the context of the later turns,
  is not there; a turn whose first call is malformed and a later one well formed runs the later
  one upstream and none here. No option reproduces this (docs/fidelity.md).
- At ``max_turns`` a turn's pending call is not run (as upstream), but the turn is closed with
  the end-of-turn token (mask 0) so the sequence stays well formed.
- A tool response that does not fit the remaining budget (``rollout.tool_response_over_budget``):
  ``drop`` is upstream's rule (its loop breaks when ``len(response) + len(tool response) >=
  budget``): the response is not appended, the turn is closed with the end-of-turn token (mask
  0; upstream generated that token itself) and the trajectory ends ``length`` with the response,
  and the length the overlong penalty sees, ending at the call. ``cut`` (the embedded default)
  appends the part that fits, so the response fills the budget.

What a :class:`Trajectory` holds: ``response_ids`` are exactly the sampled ids and the inserted
template/tool ids, never re-tokenized text; ``loss_mask`` is 1 exactly on sampled ids;
``logprobs`` are the engine's sampling log-probs (0.0 where the mask is 0); ``num_turns``
counts assistant turns; ``tool_calls`` holds one entry per call the loop answered: the code
of a well-formed call, the raw text between the tags of a malformed one (``tool_errors`` is
then True, as for a run that failed or timed out); ``text`` decodes the whole response without
special tokens, as upstream's reward manager sees it. Per call, ``tool_outcomes`` says what it
came to (:data:`agentrl.tools.sandbox.OUTCOMES`: ``parse_failure`` for a malformed call) and
``tool_queue_s`` / ``tool_run_s`` how long it waited for a worker and ran (0 for a malformed call).

Infrastructure failures (:mod:`agentrl.tools.health`): a call the sandbox lost is not the model's
doing, so its answer never enters the trajectory. The trajectory is rolled out again from its
first turn with the same turn seeds (``attempts`` 2); if the retry meets one too, it ends there
(``finish_reason`` ``infra_failure``, ``infra_failed`` True) and the stages leave it out of
advantages, pass rates and metrics. ``infra_bound`` (``sandbox.max_infra_failure_share``) stops
the call when too many do, before their problems are handed over.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

from agentrl.config import RolloutConfig
from agentrl.data.prompt_fit import prompt_length, rendered_prompt_ids
from agentrl.data.records import Problem, Trajectory
from agentrl.rollout.context import context_tokens, request_room
from agentrl.rollout.engine import Engine, GenerationOutput, Request, SamplingParams
from agentrl.rollout.tool_parser import ToolCall, ToolTurnFormat, parse_tool_call
from agentrl.tools.health import InfraFailureBound

log = logging.getLogger("agentrl.rollout")


@dataclass
class _Rollout:
    """A trajectory being built."""

    problem: Problem
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    num_turns: int = 0
    tool_calls: list[str] = field(default_factory=list)
    tool_errors: list[bool] = field(default_factory=list)
    tool_outcomes: list[str] = field(default_factory=list)
    tool_queue_s: list[float] = field(default_factory=list)
    tool_run_s: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    attempts: int = 1
    infra_failed: bool = False

    def restart(self) -> None:
        """Throw this attempt away and start again from the prompt (the next attempt)."""
        fresh = _Rollout(self.problem, self.sample_index, self.prompt_ids, attempts=self.attempts + 1)
        self.__dict__.update(fresh.__dict__)

    def add_generated(self, ids: list[int], logprobs: list[float]) -> None:
        self.response_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs

    def add_inserted(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)


@dataclass
class RolloutStats:
    """Counters of the last :meth:`AgentLoop.run` (for logs and the benchmark): ``generate_s`` is
    the time in the engine, ``tools_s`` the time the loop waited for tools with nothing to decode."""

    generated_tokens: int = 0
    inserted_tokens: int = 0
    turns: int = 0
    tool_calls: int = 0
    generate_s: float = 0.0
    tools_s: float = 0.0
    infra_failures: int = 0  # calls the sandbox lost, the retried attempts' included
    retries: int = 0  # trajectories rolled out again after one


def turn_seed(seed: int, problem_id: str, sample_index: int, turn: int) -> int:
    """The sampling seed of one assistant turn of one rollout: (call seed, problem id, sample index, turn).

    Never a position in the call, so a problem's rollouts are the same whichever problems share
    the call (scoring shards, a resumed job, a smaller batch).
    """
    return random.Random(f"agentrl-rollout:{seed}:{problem_id}:{sample_index}:{turn}").getrandbits(31)


def plain_end_of_turn_id(tokenizer) -> int:
    """The special token the chat template closes an assistant turn with (``<|im_end|>``), read
    off a rendered conversation without tools."""
    sentinel = "\x00agentrl-answer\x00"
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": sentinel}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    after = tokenizer.encode(rendered.split(sentinel, 1)[1], add_special_tokens=False)
    if not after or after[0] not in tokenizer.all_special_ids:
        raise ValueError(
            "the chat template closes an assistant turn with no special token; the agent loop "
            f"needs one as its stop token (got {rendered.split(sentinel, 1)[1][:40]!r})"
        )
    return after[0]


class AgentLoop:
    """Multi-turn rollouts of ``engine`` with the code-interpreter tool, or single-turn ones
    without it (``tools=False``: ``interpreter`` must be None)."""

    def __init__(
        self,
        engine: Engine,
        tokenizer,
        interpreter,
        cfg: RolloutConfig,
        infra_bound: InfraFailureBound | None = None,
        tools: bool = True,
    ) -> None:
        if not tools and interpreter is not None:
            raise ValueError("a self-contained agent loop (tools=False) takes no interpreter")
        self.engine = engine
        self.tokenizer = tokenizer
        self.interpreter = interpreter
        self.cfg = cfg
        self.infra_bound = infra_bound
        self.tools = tools
        self.format = ToolTurnFormat(tokenizer, cfg.tool_turn_framing) if tools else None
        self.stop_token_ids = self.format.stop_token_ids if tools else (plain_end_of_turn_id(tokenizer),)
        self.stats = RolloutStats()
        # The longest request: the engine's own limit where it has one (vLLM's max_model_len;
        # engines without one, and test doubles, have no attribute or None).
        engine_limit = getattr(engine, "max_model_len", None)
        self.context = context_tokens(tokenizer, cfg)
        if engine_limit is not None:
            self.context = min(self.context, engine_limit)

    def prompt_ids(self, problem: Problem) -> list[int]:
        """The problem's messages rendered with the tool schema (none when self-contained) and the
        generation prompt.

        A prompt over ``rollout.max_prompt_tokens`` (measured as ``prompt_length_with_tools``
        says) is refused; the ``fit_prompts`` rule drops those before any job rolls out.
        """
        ids = rendered_prompt_ids(self.tokenizer, problem.prompt, with_tools=self.tools)
        with_tools = self.cfg.prompt_length_with_tools or not self.tools
        length = len(ids) if with_tools else prompt_length(self.tokenizer, problem.prompt, with_tools=False)
        if length > self.cfg.max_prompt_tokens:
            raise ValueError(
                f"problem {problem.id!r}: the rendered prompt is {length} tokens, over "
                f"rollout.max_prompt_tokens={self.cfg.max_prompt_tokens}; drop it before the run "
                "(python -m agentrl fit-prompts, the fit_prompts rule) or raise the limit"
            )
        if len(ids) >= self.context:
            raise ValueError(
                f"problem {problem.id!r}: the prompt as sent (tool schema included) is {len(ids)} tokens, "
                f"not below the engine's context of {self.context} tokens; raise rollout.max_prompt_tokens's "
                "headroom or drop the prompt"
            )
        return ids

    def run(
        self,
        problems: list[Problem],
        n: int,
        params: SamplingParams,
        seed: int,
        on_problem_done: Callable[[list[Trajectory]], None] | None = None,
    ) -> list[Trajectory]:
        """``n`` trajectories per problem, ordered by problem then sample index.

        ``params.max_tokens`` is ignored in favour of the budget ``rollout.max_response_tokens``;
        ``params.seed`` is replaced by per-request seeds (:func:`turn_seed`) drawn from ``seed``,
        the problem id, the sample index and the turn number. ``on_problem_done`` gets a problem's
        ``n`` trajectories as soon as the last of them ends (a resumable stage writes them then).
        """
        done: list[list[Trajectory]] = [[] for _ in problems]

        def keep(number: int, trajectories: list[Trajectory]) -> None:
            done[number] = trajectories
            if on_problem_done is not None:
                on_problem_done(trajectories)

        self._roll_out(problems, n, params, seed, keep, window=None)
        return [t for group in done for t in group]

    def run_pulled(
        self,
        problems: Iterable[Problem],
        n: int,
        params: SamplingParams,
        seed: int,
        *,
        max_problems_in_flight: int | None,
    ) -> list[Trajectory]:
        """:meth:`run` over problems taken from ``problems`` only as room frees up: at most
        ``max_problems_in_flight`` at once (None: all of them), the next one taken as soon as
        one ends. Returns ``n`` trajectories per problem in the order taken. The iterable may be
        a queue that other processes draw from too (:class:`agentrl.grpo.work_sharing.ClaimQueue`),
        so it is never read ahead of the room."""
        done: dict[int, list[Trajectory]] = {}
        self._roll_out(problems, n, params, seed, done.__setitem__, window=max_problems_in_flight)
        return [t for number in sorted(done) for t in done[number]]

    def stream(
        self,
        problems: Iterable[Problem],
        n: int,
        params: SamplingParams,
        seed: int,
        on_problem_done: Callable[[list[Trajectory]], None],
        *,
        max_problems_in_flight: int,
    ) -> None:
        """:meth:`run` over a problem set of any size, in bounded memory: at most
        ``max_problems_in_flight`` problems are rolled out at once, and the next one starts as soon
        as one ends (``per_trajectory``: no chunk waits for its slowest sample; ``per_turn``
        takes them in chunks of that size). Finished trajectories are only handed to
        ``on_problem_done``, never kept."""
        self._roll_out(problems, n, params, seed, lambda _, t: on_problem_done(t), window=max_problems_in_flight)

    def _roll_out(self, problems: Iterable[Problem], n: int, params, seed: int, on_group, window: int | None) -> None:
        """Roll out ``problems`` in order; ``on_group(problem number, trajectories)`` as each problem ends."""
        assert n >= 1, f"n must be >= 1, got {n}"
        assert window is None or window >= 1, f"max_problems_in_flight must be >= 1, got {window}"
        self.stats = RolloutStats()
        turn_params = params.replace(stop_token_ids=self.stop_token_ids)
        if self.infra_bound is not None:
            on_group = self._bounded(on_group, self.infra_bound)
        if self.cfg.scheduling == "per_trajectory":
            self._run_per_trajectory(iter(problems), n, turn_params, seed, on_group, window)
        else:
            self._run_per_turn_chunks(iter(problems), n, turn_params, seed, on_group, window)
        if self.infra_bound is not None:
            self.infra_bound.check()

    @staticmethod
    def _bounded(on_group, bound: InfraFailureBound):
        """``on_group`` after the bound has seen the group (it raises before the group is handed over)."""

        def observed(number: int, trajectories: list[Trajectory]) -> None:
            bound.observe(t.infra_failed for t in trajectories)
            on_group(number, trajectories)

        return observed

    def _run_per_turn_chunks(
        self, problems: Iterator[Problem], n: int, turn_params, seed: int, on_group, window
    ) -> None:
        """Chunks of ``window`` problems (None: all), each taken from ``problems`` when the last ends."""
        start = 0
        while chunk := [(p, self.prompt_ids(p)) for p in itertools.islice(problems, window)]:
            rollouts = [_Rollout(p, i, prompt) for p, prompt in chunk for i in range(n)]
            self._run_per_turn(
                rollouts, n, turn_params, seed, lambda number, t, first=start: on_group(first + number, t)
            )
            start += len(chunk)

    # ------------------------------------------------------------------ per_trajectory
    def _run_per_trajectory(
        self, problems: Iterator[Problem], n: int, params: SamplingParams, seed: int, on_group, window: int | None
    ) -> None:
        engine = self.engine
        in_flight: dict[int, list[_Rollout]] = {}  # problem number -> its rollouts
        left_in_group: dict[int, int] = {}
        waiting_turn: dict[str, tuple[int, _Rollout]] = {}  # request id -> (problem number, rollout)
        running_tools: dict[Future, tuple[int, _Rollout, ToolCall]] = {}
        numbered = enumerate(problems)

        def admit() -> None:
            while window is None or len(in_flight) < window:
                entry = next(numbered, None)
                if entry is None:
                    return
                number, problem = entry
                prompt = self.prompt_ids(problem)
                in_flight[number] = [_Rollout(problem, i, prompt) for i in range(n)]
                left_in_group[number] = n
                for rollout in in_flight[number]:
                    next_turn(number, rollout)

        def next_turn(number: int, rollout: _Rollout) -> None:
            request = self._request(number * n + rollout.sample_index, rollout, params, seed)
            waiting_turn[request.request_id] = (number, rollout)
            engine.add_request(request)

        def go_on(number: int, rollout: _Rollout) -> None:
            if rollout.finish_reason is None:
                next_turn(number, rollout)
                return
            engine.end_session(str(number * n + rollout.sample_index))
            left_in_group[number] -= 1
            if left_in_group[number] == 0:
                del left_in_group[number]
                on_group(number, [self._trajectory(r) for r in in_flight.pop(number)])
                admit()

        admit()
        while waiting_turn or running_tools:
            if engine.has_unfinished_requests():
                started = time.perf_counter()
                ended = engine.step()
                self.stats.generate_s += time.perf_counter() - started
                for request_id, output in ended:
                    number, rollout = waiting_turn.pop(request_id)
                    call = self._end_turn(rollout, output)
                    if call is not None and call.ok:
                        running_tools[self.interpreter.submit(call.code)] = (number, rollout, call)
                        continue
                    if call is not None:  # malformed: answered at once
                        self._answer(rollout, call, call.error, failed=True, outcome="parse_failure")
                    go_on(number, rollout)
            else:
                assert running_tools, "rollouts left, but no engine request or tool call runs"
                started = time.perf_counter()
                wait(running_tools, return_when=FIRST_COMPLETED)
                self.stats.tools_s += time.perf_counter() - started
            for future in [f for f in running_tools if f.done()]:
                number, rollout, call = running_tools.pop(future)
                result = future.result()
                if result.outcome == "infra_failure":
                    self._lost_call(rollout, call, result.result)
                    if rollout.finish_reason is None:  # rolled out again: its cached turns are stale
                        engine.end_session(str(number * n + rollout.sample_index))
                else:
                    self._answer_result(rollout, call, result)
                go_on(number, rollout)
        assert not in_flight, f"{len(in_flight)} problems never finished"

    def _request(self, index: int, rollout: _Rollout, params: SamplingParams, seed: int) -> Request:
        """The engine request of the rollout's next turn (its session: the rollout's index in the call)."""
        turn = rollout.num_turns
        attempt = "" if rollout.attempts == 1 else f":attempt{rollout.attempts}"
        return Request(
            request_id=f"{index}:{turn}{attempt}",
            prompt_ids=rollout.prompt_ids + rollout.response_ids,
            params=params.replace(
                max_tokens=self._room(rollout),
                seed=turn_seed(seed, rollout.problem.id, rollout.sample_index, turn),
            ),
            session=str(index),
        )

    # ------------------------------------------------------------------ per_turn
    def _run_per_turn(self, rollouts: list[_Rollout], n: int, params: SamplingParams, seed: int, on_group):
        live = list(rollouts)
        budget = self.cfg.max_response_tokens
        while live:
            started = time.perf_counter()
            outputs = self.engine.generate(
                [r.prompt_ids + r.response_ids for r in live],
                params.replace(max_tokens=budget),
                max_tokens=[self._room(r) for r in live],
                # A rollout's own turn number: a retried one starts again at 0 (live ones are all
                # at the same turn otherwise).
                seeds=[turn_seed(seed, r.problem.id, r.sample_index, r.num_turns) for r in live],
            )
            self.stats.generate_s += time.perf_counter() - started
            calls = [(r, call) for r, output in zip(live, outputs) if (call := self._end_turn(r, output)) is not None]
            self._answer_calls(calls)
            self._report_finished(rollouts, [r for r in live if r.finish_reason is not None], n, on_group)
            live = [r for r in live if r.finish_reason is None]

    def _report_finished(self, rollouts: list[_Rollout], ended: list[_Rollout], n: int, on_group) -> None:
        """Hand over each problem whose last rollouts ended this turn (``rollouts`` are grouped by problem)."""
        position = {id(r): i for i, r in enumerate(rollouts)} if ended else {}
        for number in sorted({position[id(r)] // n for r in ended}):
            group = rollouts[number * n : (number + 1) * n]
            if all(r.finish_reason is not None for r in group):
                on_group(number, [self._trajectory(r) for r in group])

    def _answer_calls(self, calls: list[tuple[_Rollout, ToolCall]]) -> None:
        """Run the well-formed calls concurrently; append every answer as a tool-response turn."""
        runnable = [(rollout, call) for rollout, call in calls if call.ok]
        started = time.perf_counter()
        results = self.interpreter.execute_many([call.code for _, call in runnable]) if runnable else []
        self.stats.tools_s += time.perf_counter() - started
        answers = {id(rollout): result for (rollout, _), result in zip(runnable, results)}
        for rollout, call in calls:
            result = answers.get(id(rollout))
            if result is None:
                self._answer(rollout, call, call.error, failed=True, outcome="parse_failure")
            elif result.outcome == "infra_failure":
                self._lost_call(rollout, call, result.result)
            else:
                self._answer_result(rollout, call, result)

    # ------------------------------------------------------------------ one turn, either way
    def _room(self, rollout: _Rollout) -> int:
        """Tokens the rollout's next turn may generate (the budget left, within the context)."""
        return request_room(
            self.context, len(rollout.prompt_ids), len(rollout.response_ids), self.cfg.max_response_tokens
        )

    def _end_turn(self, rollout: _Rollout, output: GenerationOutput) -> ToolCall | None:
        """Append a generated turn; returns the tool call to answer, or None when the rollout ended."""
        rollout.add_generated(output.token_ids, output.logprobs)
        rollout.num_turns += 1
        self.stats.generated_tokens += len(output.token_ids)
        self.stats.turns += 1
        if output.finish_reason == "length":  # the turn ran into the budget
            rollout.finish_reason = "length"
            return None
        if not self.tools or output.token_ids[-1] != self.format.call_end_id:
            rollout.finish_reason = "stop"  # the turn ended without asking for a tool
            return None
        turn_text = self.tokenizer.decode(output.token_ids, skip_special_tokens=False)
        call = parse_tool_call(turn_text, self.cfg.tool_call_parsing)
        assert call is not None, f"a turn ending in </tool_call> must parse as a call: {turn_text!r}"
        if rollout.num_turns >= self.cfg.max_turns:
            rollout.finish_reason = "max_turns"
            self._insert(rollout, [self.format.end_of_turn_id])
            return None
        if len(rollout.response_ids) >= self.cfg.max_response_tokens:
            rollout.finish_reason = "length"  # no room left for the tool's answer
            return None
        if call.dropped:  # upstream's parser finds no call: the trajectory ends with this turn (after
            # upstream's budget and max_turns checks, which come first)
            rollout.finish_reason = "stop"
            self._insert(rollout, [self.format.end_of_turn_id])
            return None
        return call

    def _answer_result(self, rollout: _Rollout, call: ToolCall, result) -> None:
        """Answer a call with what the program did (a :class:`ToolResult` of the interpreter)."""
        execution = result.result
        self._answer(rollout, call, result.text, not result.ok, result.outcome, execution.queue_s, execution.duration_s)

    def _lost_call(self, rollout: _Rollout, call: ToolCall, execution) -> None:
        """The sandbox lost the call: roll the trajectory out again, or, on its retry, end it excluded."""
        self.stats.infra_failures += 1
        where = f"problem {rollout.problem.id!r} sample {rollout.sample_index}"
        if rollout.attempts == 1:
            self.stats.retries += 1
            log.warning("%s: the sandbox lost a tool call (%s); rolling it out again", where, execution.stderr[:300])
            rollout.restart()
            return
        self._record(rollout, call, True, "infra_failure", execution.queue_s, execution.duration_s)
        rollout.infra_failed = True
        rollout.finish_reason = "infra_failure"
        log.warning(
            "%s: the sandbox lost a tool call of the retry too (%s); the trajectory is left out",
            where,
            execution.stderr[:300],
        )

    def _record(
        self, rollout: _Rollout, call: ToolCall, failed: bool, outcome: str, queue_s: float, run_s: float
    ) -> None:
        recorded = call.code if call.ok else call.raw
        rollout.tool_calls.append(recorded if isinstance(recorded, str) else str(recorded))
        rollout.tool_errors.append(failed)
        rollout.tool_outcomes.append(outcome)
        rollout.tool_queue_s.append(float(queue_s))
        rollout.tool_run_s.append(float(run_s))
        self.stats.tool_calls += 1

    def _answer(
        self,
        rollout: _Rollout,
        call: ToolCall,
        text: str,
        failed: bool,
        outcome: str,
        queue_s: float = 0.0,
        run_s: float = 0.0,
    ) -> None:
        """Record the call and append its answer as a tool-response turn (or end, as the budget rule says)."""
        self._record(rollout, call, failed, outcome, queue_s, run_s)
        response = self.format.response_ids(text)
        over = len(rollout.response_ids) + len(response) >= self.cfg.max_response_tokens
        if over and self.cfg.tool_response_over_budget == "drop":
            rollout.finish_reason = "length"
            self._insert(rollout, [self.format.end_of_turn_id])
            return
        self._insert(rollout, response)
        if rollout.finish_reason is None and self._room(rollout) < 1:
            rollout.finish_reason = "length"  # the next turn would not fit the engine's context

    def _insert(self, rollout: _Rollout, ids: list[int]) -> None:
        """Append loop-inserted tokens (mask 0), cut to the budget; a full budget ends the trajectory."""
        room = self.cfg.max_response_tokens - len(rollout.response_ids)
        rollout.add_inserted(ids[:room])
        self.stats.inserted_tokens += min(len(ids), room)
        if len(rollout.response_ids) >= self.cfg.max_response_tokens and rollout.finish_reason is None:
            rollout.finish_reason = "length"

    def _trajectory(self, rollout: _Rollout) -> Trajectory:
        assert rollout.finish_reason is not None, "every trajectory ends with a reason"
        return Trajectory(
            problem_id=rollout.problem.id,
            sample_index=rollout.sample_index,
            prompt_ids=rollout.prompt_ids,
            response_ids=rollout.response_ids,
            loss_mask=rollout.loss_mask,
            logprobs=rollout.logprobs,
            text=self.tokenizer.decode(rollout.response_ids, skip_special_tokens=True),
            num_turns=rollout.num_turns,
            tool_calls=rollout.tool_calls,
            tool_errors=rollout.tool_errors,
            finish_reason=rollout.finish_reason,
            tool_outcomes=rollout.tool_outcomes,
            tool_queue_s=rollout.tool_queue_s,
            tool_run_s=rollout.tool_run_s,
            attempts=rollout.attempts,
            infra_failed=rollout.infra_failed,
        )
