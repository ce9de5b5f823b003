"""``copy_results=False``: step results under "next" are views of the pool's buffers, the rest copies."""

from __future__ import annotations

import torch

CARTPOLE = ["CartPole-v1"] * 3


async def rollout(pool, steps: int) -> list:
    """``steps`` lockstep step-and-resets with fixed actions; each step's results, copied at once."""
    td = await pool.reset(seed=0)
    kept = []
    for t in range(steps):
        td["action"] = torch.tensor([t % 2, 1, 0])
        out, td = await pool.step_and_maybe_reset(td)
        kept.append((out.clone(), td.clone()))
    return kept


async def test_a_rollout_is_the_same_without_copies(make_pool) -> None:
    copied = await rollout(await make_pool(CARTPOLE), 25)  # fixed actions: every env ends an episode
    viewed = await rollout(await make_pool(CARTPOLE, copy_results=False), 25)
    assert sum(bool(out["next", "done"].any()) for out, _ in copied) >= 2  # resets in between
    for (out, nxt), (out_view, nxt_view) in zip(copied, viewed, strict=True):
        assert (out == out_view).all() and (nxt == nxt_view).all()


async def test_whole_batch_next_entries_are_views_the_rest_copies(make_pool) -> None:
    pool = await make_pool(CARTPOLE, copy_results=False)
    td = await pool.reset(seed=0)
    td["action"] = torch.tensor([0, 1, 0])
    out, td = await pool.step_and_maybe_reset(td)
    stepped = out["next", "observation"].clone()
    sent_observation, next_observation = out["observation"].clone(), td["observation"].clone()
    td["action"] = torch.tensor([1, 0, 1])
    later, _ = await pool.step_and_maybe_reset(td)
    # the first result's "next" holds the second step's results now: views of the same buffers
    assert torch.equal(out["next", "observation"], later["next", "observation"])
    assert not torch.equal(out["next", "observation"], stepped)
    # what was sent and the next step's input are copies: untouched by the second step
    assert torch.equal(out["observation"], sent_observation)
    assert torch.equal(later["observation"], next_observation)
    # a batch of some envs is a copy (a gather), with or without copy_results
    part = td[:2].set("env_index", torch.tensor([0, 1]))
    first = await pool.step(part)
    kept = first["next", "observation"].clone()
    second = await pool.step(part)
    assert torch.equal(first["next", "observation"], kept)
    assert not torch.equal(second["next", "observation"], kept)
