"""Multi-turn agentic rollouts: the agent loop and the generation engines behind it.

``make_engine(cfg.rollout, model_dir)`` builds the engine the config names (``hf`` or ``vllm``),
``AgentLoop(engine, tokenizer, interpreter, cfg.rollout).run(problems, n, params, seed)`` returns
one :class:`~agentrl.data.records.Trajectory` per sample. Only the selected engine's backend is
imported.
"""

from agentrl.rollout.agent_loop import AgentLoop, RolloutStats
from agentrl.rollout.engine import Engine, GenerationOutput, SamplingParams
from agentrl.rollout.factory import load_policy, make_engine

__all__ = ["AgentLoop", "Engine", "GenerationOutput", "RolloutStats", "SamplingParams", "load_policy", "make_engine"]
