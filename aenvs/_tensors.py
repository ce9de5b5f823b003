"""Small numpy <-> torch helpers shared by the modules that build tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["torch_dtype"]


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (or anything ``np.dtype`` reads).

    Example:
        >>> torch_dtype(np.float32)
        torch.float32
    """
    return torch.from_numpy(np.empty(0, np.dtype(dtype))).dtype
