"""The PyTorch adapter (the `torch` extra): `TorchProblem` makes a Problem of an nn.Module
and a loss (flattened parameters in, flattened gradient out), `MLP` is one (`mlp`)."""

from __future__ import annotations

from privnet.agent.torchnet import MLP, TorchProblem, TorchRisk

__all__ = ["MLP", "TorchProblem", "TorchRisk"]
