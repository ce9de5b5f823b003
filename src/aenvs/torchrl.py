"""TorchRL interop, both ways (needs the ``torchrl`` extra: ``pip install aenvs[torchrl]``).

- A TorchRL env (an ``EnvBase``) can be one of a pool's envs: factories may return one,
  and :class:`TorchRLAdapter` runs it in any executor, laid out like a gymnasium env with
  the same spaces (``"observation"`` and the other observation keys at the root, one-hot
  actions taken as indices). ``NonTensor`` entries (text...) travel as non-tensor data,
  tensorclass entries as their fields; envs with a batch size of their own (``[3]``) make
  the pool's batch ``[num_envs, 3]``, as TorchRL's batched envs of batched envs have it.
- :class:`SerialEnv` / :class:`ParallelEnv` take the place of TorchRL's (swap the import,
  keep the script): TorchRL ``EnvBase`` subclasses with its constructor, specs and
  semantics, run by an aenvs pool on any executor (``executor=``).
- :class:`AenvsWrapper` is a TorchRL ``EnvBase`` over an :class:`aenvs.SerialEnv` /
  :class:`aenvs.ParallelEnv`, for TorchRL's tools that want an ``EnvBase``, such as its
  single-process collector (``SyncDataCollector``, named ``Collector`` since torchrl 0.14).

Example:
    >>> import aenvs
    >>> from torchrl.collectors import Collector
    >>> from torchrl.envs import GymEnv
    >>> from aenvs.torchrl import AenvsWrapper
    >>> env = AenvsWrapper(aenvs.ParallelEnv(4, lambda: GymEnv("CartPole-v1")))
    >>> collector = Collector(env, None, frames_per_batch=64, total_frames=640)
    >>> for batch in collector:  # a random policy
    ...     pass
    >>> batch.batch_size
    torch.Size([4, 16])
    >>> collector.shutdown()  # closes env, and the ParallelEnv's workers with it
"""

from __future__ import annotations

from aenvs._adapters.torchrl import TorchRLAdapter
from aenvs._torchrl_batched.envs import ParallelEnv, SerialEnv
from aenvs._torchrl_batched.wrapper import AenvsWrapper

__all__ = ["AenvsWrapper", "ParallelEnv", "SerialEnv", "TorchRLAdapter"]
