"""The collector over a server's pool: client episodes come out as whole Episodes, each with
the steps its client took, and the collection ends on its budget (inline executor: the
server's slots are coroutines on the pool's loop; both event loops)."""

from __future__ import annotations

import asyncio

from tensordict import TensorDictBase

import aenvs
from aenvs import AsyncPolicyClient
from aenvs._tensors import non_tensor_values
from tests.serving.support import TEXT, WAIT, policy


async def test_client_episodes_come_out_of_the_collector_whole() -> None:
    steps_of = {0: 1, 1: 3, 2: 2, 3: 4}  # per client: steps of each of its episodes

    async def client(url: str, name: int) -> None:
        async with AsyncPolicyClient(url, observation_space=TEXT, action_space=TEXT) as sim:
            for e in range(2):
                eid = await sim.start_episode(f"c{name}-{e}")
                obs = f"c{name}-{e}-0"
                for k in range(steps_of[name]):
                    action = await sim.get_action(eid, obs)
                    assert action == policy(obs)
                    await sim.log_returns(eid, 1.0)
                    obs = f"c{name}-{e}-{k + 1}"
                await sim.end_episode(eid, obs)

    def act(td: TensorDictBase) -> list[str]:
        return [policy(text) for text in non_tensor_values(td["observation"])]

    async with aenvs.serve(3, TEXT, TEXT) as server, server.pool() as pool:
        clients = [asyncio.create_task(client(server.url, c)) for c in steps_of]
        async with asyncio.timeout(WAIT):
            episodes = [e async for e in aenvs.collect(pool, act, total_episodes=8)]
            await asyncio.gather(*clients)
    assert len(episodes) == 8
    for episode in episodes:
        observations = non_tensor_values(episode.td["observation"])
        name = int(observations[0].split("-")[0][1:])
        assert episode.length == steps_of[name] and episode.terminated
        assert observations == [f"{observations[0][:-2]}-{k}" for k in range(episode.length)]
        assert episode.total_reward == episode.length
