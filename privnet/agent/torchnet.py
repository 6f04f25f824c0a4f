"""The PyTorch adapter (the `torch` extra): an nn.Module and a loss become a Problem.

privnet's models are flat float64 vectors, and so are the adapter's (the module's
parameters in `parameters()` order), so masks, sealing, accounting and the audit work
unchanged. The module itself runs in its own `dtype`, float32 unless a subclass or the
`dtype` parameter says float64: its parameters and their gradients are views into two flat
buffers of that dtype, so a model goes in with one cast-copy and a gradient comes out with
one (no per-parameter copies). A float32 problem's models take the u4 wire by default
(4 bytes a parameter: docs/tasks/big-models.md). The initial model is the module's own
initialization under `torch.manual_seed(seed)`, a public parameter, so every agent and
engine starts from the same weights. A subclass defines `module(features, classes)` (and
`loss`) and registers like any problem; `MLP` (`mlp`) and `CNN` (`cnn`) are two. torch runs
on one thread: a small model gains nothing from more, and a busy machine makes its pool far
slower.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np

from privnet.agent.spec import ConfigError

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ConfigError(
        f"the PyTorch adapter needs torch ({exc}): pip install 'privnet[torch]'"
    ) from None

# Rows a model is scored on per forward pass: the 256 test rows an agent scores every round
# through a 1M-parameter mlp's hidden layer were 27 MB of activations at once, now 7.
SCORED_AT_ONCE = 64


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _dtype(name: object) -> np.dtype[Any]:
    """float32 or float64 (what the module computes in); ConfigError for anything else."""
    known = {np.dtype(n): np.dtype(n) for n in DTYPES}
    try:
        dtype: np.dtype[Any] | None = known.get(np.dtype(cast(Any, name)))
    except TypeError:
        dtype = None
    if dtype is None:
        raise ConfigError(f"dtype {name!r}: a torch problem runs in one of {', '.join(DTYPES)}")
    return dtype


class Flat:
    """A module whose parameters, and their gradients, are views into two flat buffers of
    its dtype: `load` takes a float64 model in one cast-copy, `grad` is the gradient after
    backward() (torch accumulates into the views in place), so nothing is copied per
    parameter."""

    def __init__(self, net: nn.Module) -> None:
        params = list(net.parameters())
        dtype = params[0].dtype if params else torch.float32
        if any(p.dtype != dtype for p in params):
            raise ConfigError("a torch problem's parameters must share one dtype")
        dim = sum(p.numel() for p in params)
        self.net = net
        self.weights = torch.empty(dim, dtype=dtype)
        self.grads = torch.zeros(dim, dtype=dtype)
        at = 0
        with torch.no_grad():
            for p in params:
                view = self.weights[at : at + p.numel()].view_as(p)
                view.copy_(p)
                p.data = view
                p.grad = self.grads[at : at + p.numel()].view_as(p)
                at += p.numel()
        self.w: np.ndarray = self.weights.numpy()  # the same memory, seen by numpy
        self.g: np.ndarray = self.grads.numpy()

    def load(self, model: np.ndarray) -> None:
        np.copyto(self.w, model, casting="same_kind")

    def gradient(self, loss: Any) -> np.ndarray:
        """The flat gradient of `loss` (a view of the buffer: read it before the next call)."""
        self.grads.zero_()
        loss.backward()  # torch's backward() is untyped
        return self.g


class TorchProblem:
    """A Problem from a torch module: `module` builds it, `loss` scores its output."""

    metric = "test_accuracy"
    dtype: np.dtype[Any] = np.dtype(np.float32)  # what the module computes in

    def __init__(self, seed: int = 0, rho: float = 0.0, dtype: str | None = None) -> None:
        if not rho >= 0:
            raise ConfigError(f"rho must be >= 0, got {rho}")
        self.seed, self.rho = int(seed), float(rho)
        self.dtype = _dtype(self.dtype if dtype is None else dtype)
        self._scorers: dict[tuple[int, int], Flat] = {}

    def module(self, features: int, classes: int) -> nn.Module:
        """The network for rows of `features` (bias column included) and `classes` labels."""
        raise NotImplementedError(f"{type(self).__name__} must define module(features, classes)")

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The mean loss of a batch (default: cross-entropy on class indices)."""
        return nn.functional.cross_entropy(output, target)

    def built(self, features: int, classes: int) -> nn.Module:
        """The module in its dtype, initialized under torch.manual_seed(seed)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self.module(features, classes).to(DTYPES[self.dtype.name])

    def flat(self, features: int, classes: int) -> Flat:
        return Flat(self.built(features, classes))

    def tensor(self, x: np.ndarray) -> torch.Tensor:
        """Rows as a tensor of the module's dtype (a copy: datasets are read-only)."""
        return torch.tensor(x, dtype=DTYPES[self.dtype.name])

    def dim(self, features: int, classes: int) -> int:
        return sum(p.numel() for p in self.built(features, classes).parameters())

    def initial(self, features: int, classes: int) -> np.ndarray:
        return self.flat(features, classes).w.astype(np.float64)

    def risk(self, x: np.ndarray, y: np.ndarray, classes: int) -> TorchRisk:
        return TorchRisk(self, x, y, classes)

    def optimum(self, parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """None: a network's risk is not convex, so there is no w^o to measure MSD from."""
        return None

    def share_scorer(self, flat: Flat, features: int, classes: int) -> None:
        """`score` runs on a risk's own module (its flat buffers), not a second copy."""
        self._scorers.setdefault((features, classes), flat)

    def score(self, w: np.ndarray, x: np.ndarray, y: np.ndarray, classes: int) -> np.ndarray:
        """Accuracy on (x, y) of each model of w (K, M)."""
        key = (x.shape[1], classes)
        if key not in self._scorers:
            self._scorers[key] = self.flat(*key)
        net = self._scorers[key]
        inputs = self.tensor(x)
        right = np.empty(len(w))
        with torch.no_grad(), _one_thread():
            for k, model in enumerate(w):
                net.load(model)
                hits = 0
                for at in range(0, len(y), SCORED_AT_ONCE):  # a wide layer's activations
                    guess = net.net(inputs[at : at + SCORED_AT_ONCE]).argmax(dim=1).numpy()
                    hits += int((guess == y[at : at + SCORED_AT_ONCE]).sum())
                right[k] = hits / len(y) if len(y) else math.nan
        return right


class TorchRisk:
    """One agent's risk: its module on flat buffers, its samples as tensors."""

    def __init__(self, problem: TorchProblem, x: np.ndarray, y: np.ndarray, classes: int) -> None:
        self.problem = problem
        self.flat = problem.flat(x.shape[1], classes)
        self.net = self.flat.net
        if not any(True for _ in self.net.buffers()):  # nothing but the flat weights
            problem.share_scorer(self.flat, x.shape[1], classes)
        self.x = problem.tensor(x)
        self.y = torch.tensor(y, dtype=torch.int64)
        # the last gradient's models (the caller's, never changed in place), rows, losses
        self._seen: tuple[np.ndarray, np.ndarray | None, list[float]] | None = None

    def _batch(self, rows: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
        if rows is None:
            return self.x, self.y
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        return self.x[index], self.y[index]

    def gradient(self, w: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        x, y = self._batch(rows)
        out = np.empty_like(w)
        losses = []
        with _one_thread():
            for k, model in enumerate(w):
                self.flat.load(model)
                loss = self.problem.loss(self.net(x), y)
                losses.append(float(loss.detach()))
                out[k] = self.flat.gradient(loss)
        self._seen = (w, rows, losses)
        if self.problem.rho:
            out += 2.0 * self.problem.rho * w
        return out

    def value(self, w: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        """The losses of w on `rows`; those the last gradient's forward pass already took
        (the same models and rows: an agent's loss after a round on a full batch is the
        next round's first) are not computed again."""
        values = self._seen_losses(w, rows)
        if values is None:
            x, y = self._batch(rows)
            values = np.empty(len(w))
            with torch.no_grad(), _one_thread():
                for k, model in enumerate(w):
                    self.flat.load(model)
                    values[k] = float(self.problem.loss(self.net(x), y))
        squares: np.ndarray = np.einsum("ij,ij->i", w, w)
        return values + self.problem.rho * squares

    def _seen_losses(self, w: np.ndarray, rows: np.ndarray | None) -> np.ndarray | None:
        seen = self._seen
        if seen is None or seen[0].shape != w.shape:
            return None
        before, seen_rows, losses = seen
        same_rows = rows is seen_rows or (
            rows is not None and seen_rows is not None and np.array_equal(rows, seen_rows)
        )
        return (
            np.array(losses, dtype=np.float64) if same_rows and np.array_equal(before, w) else None
        )


class MLP(TorchProblem):
    """A multilayer perceptron: `hidden` layer widths, ReLU (or tanh) between them, one
    output per class."""

    def __init__(
        self,
        hidden: Sequence[int] = (32,),
        activation: str = "relu",
        seed: int = 0,
        rho: float = 0.0,
        dtype: str | None = None,
    ) -> None:
        super().__init__(seed, rho, dtype)
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


class CNN(TorchProblem):
    """A LeNet-like convolutional network for square grey images (a row's pixels, then its
    bias column, which the network leaves out): per entry of `channels` a 3x3 convolution
    (padded), ReLU and 2x2 max-pooling; then ReLU layers of `hidden` widths and one output
    per class. On digits (8x8), channels (32, 64) and hidden (384,): 121,354 parameters."""

    def __init__(
        self,
        channels: Sequence[int] = (8, 16),
        hidden: Sequence[int] = (64,),
        seed: int = 0,
        rho: float = 0.0,
        dtype: str | None = None,
    ) -> None:
        super().__init__(seed, rho, dtype)
        if not channels or any(int(c) < 1 for c in channels):
            raise ConfigError(f"channels must list one or more counts >= 1, got {channels}")
        if any(int(h) < 1 for h in hidden):
            raise ConfigError(f"hidden must list layer widths >= 1, got {hidden}")
        self.channels, self.hidden = tuple(int(c) for c in channels), tuple(int(h) for h in hidden)

    def side(self, features: int) -> int:
        """The images' side: `features` is side^2 pixels and the bias column."""
        side = math.isqrt(max(features - 1, 0))
        if side * side != features - 1:
            raise ConfigError(
                f"cnn takes square images: rows of side^2 pixels and a bias column, but these "
                f"rows have {features - 1} features besides the bias, not a square; pick an "
                "image dataset (digits: 8x8) or the mlp problem"
            )
        if side < 2 ** len(self.channels):
            raise ConfigError(
                f"cnn: {len(self.channels)} convolutions halve the side {len(self.channels)} "
                f"times, more than {side}x{side} images allow; list fewer channels"
            )
        return side

    def module(self, features: int, classes: int) -> nn.Module:
        if classes < 2:
            raise ConfigError("cnn classifies: its data needs class labels (a dataset)")
        side = self.side(features)
        layers: list[Any] = [Images(side)]
        for a, b in itertools.pairwise((1, *self.channels)):
            layers += [nn.Conv2d(a, b, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            side //= 2
        widths = (self.channels[-1] * side * side, *self.hidden)
        layers.append(nn.Flatten())
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(widths[-1], classes))


class Images(nn.Module):
    """Rows (N, side^2 + 1) as images (N, 1, side, side): the bias column left out."""

    def __init__(self, side: int) -> None:
        super().__init__()
        self.side = side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :-1].reshape(-1, 1, self.side, self.side)
