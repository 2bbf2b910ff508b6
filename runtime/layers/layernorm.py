"""RMSNorm (Zhang & Sennrich, 2019) with the residual add fused in."""

from __future__ import annotations

import torch
from pagoda.kernels import ops
from pagoda.runtime.layers.custom_op import CustomOp
from torch import nn


class RMSNorm(CustomOp):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual),
        the pre-norm transformer's two uses of one sum. Statistics in float32
        whatever the activation dtype, as transformers does."""
        return ops.rms_norm(
            x, self.weight, self.eps, residual, triton=self.use_triton, cpu=self.use_cpu_kernels
        )
