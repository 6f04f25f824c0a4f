"""The PyTorch adapter (the `torch` extra): `TorchProblem` makes a Problem of an nn.Module
and a loss (flattened parameters in, flattened gradient out); `MLP` (`mlp`) and `CNN`
(`cnn`) are two."""

from __future__ import annotations

from privnet.agent.torchnet import CNN, MLP, TorchProblem, TorchRisk

__all__ = ["CNN", "MLP", "TorchProblem", "TorchRisk"]
