"""Rotary position embedding for self-attention.

Shapes follow the legend in :mod:`seq2seq.nn.attention`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding:
    """Rotary position embedding (RoPE; Su et al. 2021, "RoFormer", Sec. 3.4, Eq. 34).

    Rotates each pair of query/key coordinates ``(x_i, x_{i + Dh/2})`` at position ``p`` by the
    angle ``p * theta_i`` with ``theta_i = base^(-2i / Dh)``, so that the dot product of a query
    at position ``m`` and a key at position ``n`` depends on ``m - n`` only. The pairs are the
    two halves of the head (the arrangement of GPT-NeoX and Hugging Face's LLaMA), which is the
    paper's interleaved pairing up to a fixed permutation of the head's coordinates.

    The cosine/sine tables are computed in float64 on first use per device and kept in float32
    (float64 for float64 inputs); the rotation runs in that precision and returns the input's
    dtype. They are plain attributes, not buffers: nothing enters the state dict and
    ``module.to(dtype)`` leaves them in full precision.

    Args:
        head_dim: head width ``Dh`` (even).
        max_positions: number of positions in the tables.
        base: the ``base`` of ``theta_i`` (10000 in the paper).

    Raises:
        ValueError: if ``head_dim`` is odd.
    """

    def __init__(self, head_dim: int, max_positions: int, base: float = 10000.0) -> None:
        if head_dim % 2:
            raise ValueError(f"rotary positions need an even head width, got {head_dim}")
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.base = base
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}

    def tables(self, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cos, sin)``, each ``(max_positions, Dh / 2)`` in ``dtype``."""
        key = (device, dtype)
        if key not in self._tables:
            half = self.head_dim // 2
            theta = self.base ** (-torch.arange(half, dtype=torch.float64) * 2 / self.head_dim)
            angles = torch.arange(self.max_positions, dtype=torch.float64)[:, None] * theta
            self._tables[key] = (
                angles.cos().to(device, dtype),
                angles.sin().to(device, dtype),
            )
        return self._tables[key]

    def __call__(self, x: Tensor, offset: int = 0) -> Tensor:
        """Rotate ``(B, H, L, Dh)`` queries or keys at positions ``offset .. offset + L - 1``.

        Returns:
            ``(B, H, L, Dh)``, ``x``'s dtype.
        """
        length = x.size(-2)
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self.tables(x.device, work)
        cos, sin = cos[offset : offset + length], sin[offset : offset + length]
        x1, x2 = x.to(work).chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def __repr__(self) -> str:
        return f"RotaryEmbedding(head_dim={self.head_dim}, base={self.base})"
