"""The PyTorch adapter (the `torch` extra): an nn.Module and a loss become a Problem.

privnet's models are flat float64 vectors, and so are the adapter's (the module's
parameters in `parameters()` order, the module run in float64), so masks, sealing,
accounting and the audit work unchanged. The initial model is the module's own
initialization under `torch.manual_seed(seed)`, a public parameter, so every agent and
engine starts from the same weights. A subclass defines `module(features, classes)` (and
`loss`) and registers like any problem; `MLP` (`problem = "mlp"`) is one. torch runs on one
thread: a small model gains nothing from more, and a busy machine makes its pool far slower.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from privnet.agent.spec import ConfigError

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ConfigError(
        f"the PyTorch adapter needs torch ({exc}): pip install 'privnet[torch]'"
    ) from None


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class TorchProblem:
    """A Problem from a torch module: `module` builds it, `loss` scores its output."""

    metric = "test_accuracy"

    def __init__(self, seed: int = 0, rho: float = 0.0) -> None:
        if not rho >= 0:
            raise ConfigError(f"rho must be >= 0, got {rho}")
        self.seed, self.rho = int(seed), float(rho)

    def module(self, features: int, classes: int) -> nn.Module:
        """The network for rows of `features` (bias column included) and `classes` labels."""
        raise NotImplementedError(f"{type(self).__name__} must define module(features, classes)")

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The mean loss of a batch (default: cross-entropy on class indices)."""
        return nn.functional.cross_entropy(output, target)

    def built(self, features: int, classes: int) -> nn.Module:
        """The module in float64, initialized under torch.manual_seed(seed)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self.module(features, classes).double()

    def dim(self, features: int, classes: int) -> int:
        return sum(p.numel() for p in self.built(features, classes).parameters())

    def initial(self, features: int, classes: int) -> np.ndarray:
        net = self.built(features, classes)
        flat: np.ndarray = nn.utils.parameters_to_vector(net.parameters()).detach().numpy()
        return flat

    def risk(self, x: np.ndarray, y: np.ndarray, classes: int) -> TorchRisk:
        return TorchRisk(self, x, y, classes)

    def optimum(self, parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """None: a network's risk is not convex, so there is no w^o to measure MSD from."""
        return None

    def score(self, w: np.ndarray, x: np.ndarray, y: np.ndarray, classes: int) -> np.ndarray:
        """Accuracy on (x, y) of each model of w (K, M)."""
        net = self.built(x.shape[1], classes)
        inputs = torch.tensor(x, dtype=torch.float64)
        right = np.empty(len(w))
        with torch.no_grad(), _one_thread():
            for k, model in enumerate(w):
                _load(net, model)
                right[k] = (net(inputs).argmax(dim=1).numpy() == y).mean()
        return right


class TorchRisk:
    """One agent's risk: its module, its samples as tensors."""

    def __init__(self, problem: TorchProblem, x: np.ndarray, y: np.ndarray, classes: int) -> None:
        self.problem = problem
        self.net = problem.built(x.shape[1], classes)
        self.x = torch.tensor(x, dtype=torch.float64)  # copies: datasets are read-only
        self.y = torch.tensor(y, dtype=torch.int64)

    def _batch(self, rows: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
        if rows is None:
            return self.x, self.y
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        return self.x[index], self.y[index]

    def gradient(self, w: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        x, y = self._batch(rows)
        out = np.empty_like(w)
        with _one_thread():
            for k, model in enumerate(w):
                _load(self.net, model)
                self.net.zero_grad(set_to_none=False)
                loss: Any = self.problem.loss(self.net(x), y)  # torch's backward() is untyped
                loss.backward()
                grads = [p.grad for p in self.net.parameters()]
                out[k] = nn.utils.parameters_to_vector(grads).numpy()  # type: ignore[arg-type]
        return out + 2.0 * self.problem.rho * w

    def value(self, w: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        x, y = self._batch(rows)
        values = np.empty(len(w))
        with torch.no_grad(), _one_thread():
            for k, model in enumerate(w):
                _load(self.net, model)
                values[k] = float(self.problem.loss(self.net(x), y))
        values += self.problem.rho * np.sum(w**2, axis=-1)
        return values


def _load(net: nn.Module, flat: np.ndarray) -> None:
    nn.utils.vector_to_parameters(torch.from_numpy(np.ascontiguousarray(flat)), net.parameters())


class MLP(TorchProblem):
    """A multilayer perceptron: `hidden` layer widths, ReLU (or tanh) between them, one
    output per class."""

    def __init__(
        self,
        hidden: Sequence[int] = (32,),
        activation: str = "relu",
        seed: int = 0,
        rho: float = 0.0,
    ) -> None:
        super().__init__(seed, rho)
        if activation not in ACTIVATIONS:
            raise ConfigError(f"activation {activation!r}: choose {', '.join(ACTIVATIONS)}")
        if not hidden or any(int(h) < 1 for h in hidden):
            raise ConfigError(f"hidden must list one or more layer widths >= 1, got {hidden}")
        self.hidden, self.activation = tuple(int(h) for h in hidden), activation

    def module(self, features: int, classes: int) -> nn.Module:
        if classes < 2:
            raise ConfigError("mlp classifies: its data needs class labels (a dataset)")
        widths = (features, *self.hidden)
        layers: list[Any] = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), ACTIVATIONS[self.activation]()]
        return nn.Sequential(*layers, nn.Linear(widths[-1], classes))


ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}
