"""Two vector envs stepped side by side, for the equivalence tests (aenvs's against gymnasium's)."""

from __future__ import annotations

from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, VectorEnv


def run_both(
    ours: VectorEnv, theirs: VectorEnv, mode: AutoresetMode, steps: int = 100, seed: int = 123
) -> int:
    """Reset both with ``seed``, take ``steps`` steps of actions sampled from ``theirs``'s
    seeded batched action space in both, and assert equal results at every step (and after
    every partial reset under ``DISABLED``); return how many episodes ended."""
    assert data_equivalence(ours.reset(seed=seed), theirs.reset(seed=seed), exact=True)
    theirs.action_space.seed(seed)
    ended = 0
    for t in range(steps):
        actions = theirs.action_space.sample()
        got, expected = ours.step(actions), theirs.step(actions)
        assert data_equivalence(got, expected, exact=True), f"step {t}:\n{got}\n!=\n{expected}"
        done = expected[2] | expected[3]
        ended += int(done.sum())
        if mode is AutoresetMode.DISABLED and done.any():
            options = {"reset_mask": done}
            got_reset = ours.reset(options=options)
            expected_reset = theirs.reset(options=dict(options))
            assert data_equivalence(got_reset, expected_reset, exact=True), f"reset after step {t}"
    return ended
