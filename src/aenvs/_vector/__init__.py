"""The internals of :class:`aenvs.gymnasium.AsyncVectorEnv`, gymnasium's vector API.

- ``spaces``: its batched spaces (``observation_mode``) and the checks gymnasium makes on them.
- ``conversion``: numpy batches <-> the pool's TensorDicts: the observation reader and the
  action writer built for its spaces.
- ``values``: the batches of spaces without a fixed shape (Text, Sequence, Graph, OneOf,
  custom): a tuple of each env's value, read out of the pool's non-tensor entries.
- ``results``: gymnasium's step and reset returns, out of the pool's results: the kept
  observations, vector infos, float64 rewards.
- ``arguments``: reset arguments checked as gymnasium checks them (seeds, ``reset_mask``).
"""
