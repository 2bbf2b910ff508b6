"""Activations of gated MLPs."""

from __future__ import annotations

import torch
from pagoda.kernels import ops
from pagoda.runtime.layers.custom_op import CustomOp


class SiluAndMul(CustomOp):
    """silu(gate) * up, where the input is the fused [gate | up] projection."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.silu_and_mul(x, triton=self.use_triton, cpu=self.use_cpu_kernels)
