"""A tool-using text agent, collected with ``aenvs.collect``.

An LLM-agent env in miniature: each episode is a question from a dataset (with its known
answer, given to the env through the reset options); the agent observes the transcript as
text and acts with text, ``CALL <tool> <input>`` or ``ANSWER <answer>``. The tools are a
real HTTP service this script starts on 127.0.0.1 (a calculator and a key-value search,
served and called with aiohttp), each request answered after a long-tailed random latency,
as web tools and remote sandboxes answer. A right answer pays 1; an episode ends at its answer or after
``--max-turns`` turns.

The env is a gymnasium env whose ``step`` is ``async def`` (it awaits its HTTP request),
so the inline executor runs every env as a coroutine on the event loop: many slow envs
cost no thread or process each. The policy stands for a batched inference server's
client: an ``async def`` whose cost grows a little with the batch, answering with simple
rules on the transcript. ``aenvs.collect`` keeps every env busy: while the policy works on
one batch, the envs that finish their tool call gather for the next one.

Two pool options that such envs need:

* ``step_timeout`` and ``episode_timeout`` with ``on_timeout="truncate"``: the search
  service's upstream hangs on a few keys (as real ones do); the deadline ends those
  episodes as truncated, flagged ``timed_out``, instead of stalling an env for good.
* ``max_concurrency``: the tool service's quota of requests at once (and ``--rate``, a
  shared ``aenvs.RateLimit`` of requests per second).

Run (needs aiohttp: ``pip install aiohttp``, or the repository's ``examples`` dependency group):
    python examples/agent_env.py --envs 64 --episodes 1000
    python examples/agent_env.py --quick        # a few seconds
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import math
import operator
import random
import re
import string
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import gymnasium as gym
from aiohttp import web
from gymnasium import spaces
from tensordict import TensorDictBase

import aenvs

# -- the tool service ------------------------------------------------------------------

CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo",
    "Egypt": "Cairo", "Canada": "Ottawa", "Chile": "Santiago", "India": "New Delhi", "Spain": "Madrid",
}  # fmt: skip
POPULATIONS = {  # thousands
    "Lyon": 522, "Osaka": 2750, "Mombasa": 1208, "Cusco": 428, "Bergen": 291,
    "Luxor": 507, "Calgary": 1306, "Valparaiso": 296, "Pune": 3124, "Seville": 684,
}  # fmt: skip
NO_RESULT = "no result"
# keys the search service's upstream never answers: it holds the request until the client gives up
HUNG = {"population of Atlantis"}
# keys in the dataset that the search service does not hold: the agent cannot answer those
UNKNOWN_CAPITALS = {"Wakanda": "Birnin Zana"}

_OPERATORS: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
}


def calculate(expression: str) -> str:
    """Integer ``+ - *`` arithmetic, the calculator tool's whole job."""

    def value(node: ast.expr) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(expression)

    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, RecursionError):
        return "error: not an expression"


def search(key: str) -> str:
    """The search tool: ``capital of <country>`` or ``population of <city>``."""
    if key.startswith("capital of "):
        return CAPITALS.get(key.removeprefix("capital of "), NO_RESULT)
    if key.startswith("population of ") and (city := key.removeprefix("population of ")) in POPULATIONS:
        return str(POPULATIONS[city])
    return NO_RESULT


class ToolService:
    """The tools as an HTTP service on 127.0.0.1 (aiohttp's server): ``GET /calc?q=...`` and
    ``GET /search?q=...``, each answered after a lognormal latency (``median`` seconds, ``sigma``).
    A request for a key the upstream hangs on is answered only when the service closes; the
    client that gives up on it closes its connection, which cancels the request's handler."""

    def __init__(self, *, median: float = 0.05, sigma: float = 0.8, seed: int = 0) -> None:
        self.median, self.sigma = median, sigma
        self.rng = random.Random(seed)
        self.requests = 0
        self.port = 0
        app = web.Application()
        app.add_routes([web.get("/calc", self._calc), web.get("/search", self._search)])
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        self._closing = asyncio.Event()

    async def __aenter__(self) -> ToolService:
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing.set()  # requests still hanging give up
        await self._runner.cleanup()

    async def _calc(self, request: web.Request) -> web.Response:
        return await self._answer(calculate, request.query.get("q", ""))

    async def _search(self, request: web.Request) -> web.Response:
        return await self._answer(search, request.query.get("q", ""))

    async def _answer(self, tool: Callable[[str], str], query: str) -> web.Response:
        self.requests += 1
        if tool is search and query in HUNG:
            await self._closing.wait()
            raise web.HTTPGatewayTimeout(text="the upstream never answered")
        await asyncio.sleep(self.rng.lognormvariate(math.log(self.median), self.sigma))
        return web.Response(text=tool(query))


# -- the env -----------------------------------------------------------------------------

TEXT = frozenset(string.printable)


class AgentEnv(gym.Env[str, str]):
    """A question per episode (reset options ``{"question": ..., "answer": ...}``); the
    observation is the transcript so far, the action ``CALL <tool> <input>`` or
    ``ANSWER <answer>``."""

    observation_space = spaces.Text(4096, min_length=0, charset=TEXT)
    action_space = spaces.Text(256, min_length=0, charset=TEXT)

    def __init__(self, tools: aiohttp.ClientSession, max_turns: int) -> None:
        self.tools = tools  # shared by the envs: one pool of keep-alive connections
        self.max_turns = max_turns
        self.answer = ""
        self.transcript = ""
        self.turns = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = options or {"question": "What is 1 + 1?", "answer": "2"}
        self.answer = task["answer"]
        self.transcript = f"Q: {task['question']}"
        self.turns = 0
        return self.transcript, {}

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:  # type: ignore[override]
        self.turns += 1
        verb, _, rest = action.partition(" ")
        reward, terminated = 0.0, False
        if verb == "ANSWER":
            reward, terminated = float(rest.strip() == self.answer), True
            reply = "correct" if reward else "wrong"
        elif verb == "CALL":
            tool, _, query = rest.partition(" ")
            # a deadline that cancels this step cancels the request (aiohttp closes its connection)
            async with self.tools.get(f"/{tool}", params={"q": query}) as response:
                status, body = response.status, await response.text()
            reply = f"{tool}: {body}" if status == 200 else f"error: {body}"
        else:
            reply = "error: say CALL <tool> <input> or ANSWER <answer>"
        self.transcript += f"\n> {action}\n{reply}"
        truncated = not terminated and self.turns >= self.max_turns
        return self.transcript, reward, terminated, truncated, {}


# -- the dataset and the policy -----------------------------------------------------------


def make_tasks(count: int, seed: int) -> list[dict[str, str]]:
    """Questions with their answers: arithmetic, a capital, a population times a number. A few
    ask for what the search service does not hold, or for a key its upstream hangs on."""
    rng = random.Random(seed)
    capitals = {**CAPITALS, **UNKNOWN_CAPITALS}
    populations = {**POPULATIONS, **{key.removeprefix("population of "): 0 for key in HUNG}}
    tasks: list[dict[str, str]] = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.4:
            a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(1, 9)
            expression = f"{a} {rng.choice('+-*')} {b} + {c}"
            tasks.append({"question": f"What is {expression}?", "answer": calculate(expression)})
        elif kind < 0.7:
            country = rng.choice(sorted(capitals))
            tasks.append({"question": f"What is the capital of {country}?", "answer": capitals[country]})
        else:
            city, times = rng.choice(sorted(populations)), rng.randint(2, 9)
            question = f"What is the population of {city}, in thousands, times {times}?"
            tasks.append({"question": question, "answer": str(populations[city] * times)})
    return tasks


def act(transcript: str) -> str:
    """The toy agent's next action: rules on the question and the last tool result."""
    lines = transcript.splitlines()
    question = lines[0].removeprefix("Q: ")
    last = lines[-1] if len(lines) > 1 else ""
    result = last.partition(": ")[2]
    if m := re.fullmatch(r"What is ([-+* 0-9]+)\?", question):
        return f"ANSWER {result}" if last.startswith("calc: ") else f"CALL calc {m[1]}"
    if m := re.fullmatch(r"What is the capital of (\w+)\?", question):
        found = last.startswith("search: ") and result != NO_RESULT
        return f"ANSWER {result}" if found else f"CALL search capital of {m[1]}"  # no result: ask again
    if m := re.fullmatch(r"What is the population of (\w+), in thousands, times (\d+)\?", question):
        if last.startswith("calc: "):
            return f"ANSWER {result}"
        if last.startswith("search: ") and result != NO_RESULT:
            return f"CALL calc {result} * {m[2]}"
        return f"CALL search population of {m[1]}"
    return "ANSWER I do not know"


class InferenceClient:
    """Stands for a batched inference server's client: a call costs a fixed time plus a
    little per row, and many calls may be in flight (``aenvs.collect``'s ``max_policy_calls``)."""

    def __init__(self, fixed: float = 0.002, per_row: float = 0.00001) -> None:
        self.fixed, self.per_row = fixed, per_row
        self.calls = 0
        self.rows = 0

    async def __call__(self, td: TensorDictBase) -> list[str]:
        transcripts: list[str] = td["observation"].tolist()
        self.calls += 1
        self.rows += len(transcripts)
        await asyncio.sleep(self.fixed + self.per_row * len(transcripts))
        return [act(text) for text in transcripts]


# -- the run -------------------------------------------------------------------------------


def seconds(p: aenvs.LatencyPercentiles) -> str:
    return f"p50 {p.pool_p50 * 1e3:.1f} ms, p90 {p.pool_p90 * 1e3:.1f} ms, p99 {p.pool_p99 * 1e3:.1f} ms"


async def main(args: argparse.Namespace) -> None:
    tasks = make_tasks(args.episodes, args.seed)
    policy = InferenceClient()
    outcomes = dict.fromkeys(["answered right", "answered wrong", "out of turns", "timed out"], 0)
    async with (
        ToolService(seed=args.seed) as service,
        # no cap on connections of its own: the pool's max_concurrency is the tools' quota
        aiohttp.ClientSession(
            f"http://127.0.0.1:{service.port}", connector=aiohttp.TCPConnector(limit=0)
        ) as tools,
    ):

        def make_env() -> AgentEnv:
            return AgentEnv(tools, args.max_turns)

        async with aenvs.AsyncEnvPool(
            [make_env] * args.envs,
            executor="inline",
            step_timeout=args.step_timeout,
            episode_timeout=args.episode_timeout,
            on_timeout="truncate",
            max_concurrency=args.max_concurrency,
            rate_limit=aenvs.RateLimit(args.rate, burst=args.envs) if args.rate else None,
        ) as pool:
            print(
                f"{args.envs} agent envs (executor='inline'), tools at http://127.0.0.1:{service.port}, "
                f"{len(tasks)} tasks",
                flush=True,
            )
            started = time.perf_counter()
            steps = 0
            async for episode in aenvs.collect(pool, policy, tasks=tasks):
                assert isinstance(episode, aenvs.Episode)  # episodes only: no frames_per_batch
                steps += episode.length
                if episode.timed_out:
                    outcomes["timed out"] += 1
                elif episode.terminated:
                    outcomes["answered right" if episode.total_reward > 0 else "answered wrong"] += 1
                else:
                    outcomes["out of turns"] += 1
            elapsed = time.perf_counter() - started
            stats = pool.stats()
    episodes = sum(outcomes.values())
    print(f"episodes: {episodes} in {elapsed:.2f} s ({episodes / elapsed:,.1f} episodes/s)")
    print(f"steps: {steps} ({steps / elapsed:,.1f} steps/s), tool requests: {service.requests}")
    print(f"success rate: {outcomes['answered right'] / episodes:.1%}")
    print("outcomes: " + ", ".join(f"{name} {count}" for name, count in outcomes.items()))
    print(f"timed-out episodes: {outcomes['timed out']}")
    print(f"policy calls: {policy.calls}, {policy.rows / policy.calls:.1f} envs per call")
    print(f"env latency: {seconds(stats.env_latency)} (answers and resets: instant)")
    print(f"policy wait: {seconds(stats.policy_wait)}")
    print(f"limit wait:  {seconds(stats.limit_wait)} ({stats.limit_wait_seconds:.2f} s held in all)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="A tool-using text agent env driven by aenvs.collect",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--envs", type=int, default=64, help="envs in the pool")
    parser.add_argument("--episodes", type=int, default=2000, help="tasks in the dataset (one episode each)")
    parser.add_argument("--max-turns", type=int, default=4, help="turns before an episode is truncated")
    parser.add_argument("--step-timeout", type=float, default=1.0, help="seconds a step may take")
    parser.add_argument("--episode-timeout", type=float, default=5.0, help="seconds an episode may take")
    parser.add_argument(
        "--max-concurrency", type=int, help="steps running at once, the tool's quota (default: 3/4 of --envs)"
    )
    parser.add_argument("--rate", type=float, default=0.0, help="steps per second for all envs (0: no limit)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the dataset and the tool latencies")
    parser.add_argument("--quick", action="store_true", help="16 envs, 150 episodes")
    args = parser.parse_args(argv)
    if args.quick:
        args.envs, args.episodes = 16, 150
    if args.max_concurrency is None:
        args.max_concurrency = max(1, args.envs * 3 // 4)
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
