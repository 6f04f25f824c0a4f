"""Labelled datasets every agent loads on its own machine (nothing is downloaded at run time).

Agents load the same arrays as the orchestrator and take their own rows, so raw data never
crosses the wire. A dataset is a plug-in (`privnet.agent.plugins`) returning a `Dataset`: `adult`
(shipped in privnet/agent/data), scikit-learn's bundled `digits`, `breast-cancer` and `wine`,
one of the user's cached torchvision or Hugging Face datasets (`torchvision:MNIST`, `hf:NAME`:
`privnet.agent.hubs`), an entry point in `privnet.datasets`, or `module:function`. Every
problem relies on features standardized with the training split's mean and std plus a
constant 1 last (the bias, which feature noise leaves alone), and labels 0 .. classes-1.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import lzma
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from privnet.agent import hubs, plugins
from privnet.agent.spec import ConfigError

DATA = Path(__file__).resolve().parent / "data"
TEST_FRACTION = 0.25  # of each class, for datasets that come without a test split

_NUMERIC = (0, 4, 10, 11, 12)  # age, education-num, capital-gain, capital-loss, hours-per-week
_LOG = (10, 11)
_CATEGORICAL = (1, 5, 6, 7, 8, 9)  # workclass, marital, occupation, relationship, race, sex
_COUNTRY, _LABEL = 13, 14


@dataclass(frozen=True)
class Dataset:
    """Features (bias column last) and class indices, split into training and test rows."""

    x_train: np.ndarray  # (N, F)
    y_train: np.ndarray  # (N,) int64 in [0, classes)
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int

    def __post_init__(self) -> None:
        for x, y, split in (
            (self.x_train, self.y_train, "train"),
            (self.x_test, self.y_test, "test"),
        ):
            if x.ndim != 2 or y.shape != (len(x),):
                raise ConfigError(
                    f"dataset {split} split: x must be (N, F) and y (N,), "
                    f"got {x.shape} and {y.shape}"
                )
            if len(y) and (y.min() < 0 or y.max() >= self.classes):
                raise ConfigError(
                    f"dataset {split} labels must be class indices 0..{self.classes - 1}"
                )
        if self.x_test.shape[1] != self.x_train.shape[1]:
            raise ConfigError("dataset: the train and test splits have different features")

    @property
    def dim(self) -> int:
        """Features per row, the bias included."""
        return int(self.x_train.shape[1])


def standardized(
    x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray
) -> Dataset:
    """A Dataset from raw features and labels: features standardized by the training
    split (constant features left at 0), a bias column appended, labels renumbered
    0 .. classes-1 in sorted order; every array read-only."""
    x_train, x_test = np.asarray(x_train, dtype=float), np.asarray(x_test, dtype=float)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    std[std == 0] = 1.0
    levels, y_train = np.unique(np.asarray(y_train), return_inverse=True)
    y_test = np.searchsorted(levels, np.asarray(y_test))

    def features(x: np.ndarray) -> np.ndarray:
        return np.hstack([(x - mean) / std, np.ones((len(x), 1))])

    arrays = (
        features(x_train),
        y_train.astype(np.int64),
        features(x_test),
        y_test.astype(np.int64),
    )
    for arr in arrays:
        arr.setflags(write=False)
    return Dataset(*arrays, classes=len(levels))


def split(x: np.ndarray, y: np.ndarray) -> Dataset:
    """A dataset without a test split, split by a fixed rule: the last TEST_FRACTION of each
    class, in an order shuffled by the public seed 0, is the test split."""
    order = np.random.default_rng(0).permutation(len(y))
    test = np.zeros(len(y), dtype=bool)
    for label in np.unique(y):
        mine = order[y[order] == label]
        test[mine[len(mine) - round(TEST_FRACTION * len(mine)) :]] = True
    return standardized(x[~test], y[~test], x[test], y[test])


def _adult_rows(name: str) -> list[list[str]]:
    text = lzma.decompress((DATA / "adult" / name).read_bytes()).decode("ascii")
    rows = csv.reader(io.StringIO(text), skipinitialspace=True)
    return [r for r in rows if len(r) == _LABEL + 1]  # skips blanks and adult.test's header


def adult() -> Dataset:
    """UCI Adult (income > 50K is class 1): five numeric columns (capital gain and loss
    through log1p first), one-hot categoricals, US or not; shipped in privnet/agent/data/adult."""
    train, test = _adult_rows("adult.data.xz"), _adult_rows("adult.test.xz")
    levels = [sorted({r[c] for r in train}) for c in _CATEGORICAL]

    def encode(rows: list[list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        num = np.array([[float(r[c]) for c in _NUMERIC] for r in rows])
        for c in _LOG:
            num[:, _NUMERIC.index(c)] = np.log1p(num[:, _NUMERIC.index(c)])
        onehot = [
            np.array([[r[c] == v for v in lv] for r in rows], dtype=float)
            for c, lv in zip(_CATEGORICAL, levels, strict=True)
        ]
        us = np.array([[r[_COUNTRY] == "United-States"] for r in rows], dtype=float)
        label = np.array([r[_LABEL].rstrip(".") == ">50K" for r in rows], dtype=np.int64)
        return num, np.hstack([*onehot, us]), label

    num_train, cat_train, y_train = encode(train)
    num_test, cat_test, y_test = encode(test)
    mean, std = num_train.mean(0), num_train.std(0)
    arrays = (
        np.hstack([(num_train - mean) / std, cat_train, np.ones((len(train), 1))]),
        y_train,
        np.hstack([(num_test - mean) / std, cat_test, np.ones((len(test), 1))]),
        y_test,
    )
    for arr in arrays:
        arr.setflags(write=False)
    return Dataset(*arrays, classes=2)


def _sklearn_data(name: str) -> Path:
    """The path of one of scikit-learn's bundled data files, found without importing
    scikit-learn: its import pulls in scipy and pandas, about 140 MB of every agent's RSS
    and a second of its start-up, for a file of a few hundred kB."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise ConfigError(
            f"scikit-learn's {name} needs the extra: pip install 'privnet[sklearn]'"
        ) from None
    path = Path(spec.origin).parent / "datasets" / "data" / name
    if not path.is_file():
        raise ConfigError(
            f"scikit-learn at {path.parent.parent.parent} has no {name}: reinstall it"
        )
    return path


def _bundled_csv(name: str) -> Dataset:
    """A table of scikit-learn's bundled `load_csv_data` format (a header of the counts and
    class names, then rows of features and the class), read as its loader reads it."""
    with _sklearn_data(name).open(encoding="utf-8") as fh:
        rows = csv.reader(fh)
        head = next(rows)
        x, y = np.empty((int(head[0]), int(head[1]))), np.empty(int(head[0]), dtype=int)
        for i, row in enumerate(rows):
            x[i] = np.asarray(row[:-1], dtype=np.float64)
            y[i] = int(row[-1])
    return split(x, y)


def digits() -> Dataset:
    """scikit-learn's 8x8 handwritten digits: 1797 rows, 64 pixels, 10 classes."""
    with gzip.open(_sklearn_data("digits.csv.gz"), mode="rt", encoding="utf-8") as fh:
        data = np.loadtxt(fh, delimiter=",")
    return split(data[:, :-1], data[:, -1].astype(int))


def breast_cancer() -> Dataset:
    """scikit-learn's Wisconsin breast cancer: 569 rows, 30 features, 2 classes."""
    return _bundled_csv("breast_cancer.csv")


def wine() -> Dataset:
    """scikit-learn's wine recognition: 178 rows, 13 features, 3 classes."""
    return _bundled_csv("wine_data.csv")


BUILTIN = {
    "adult": "privnet.agent.datasets:adult",
    "digits": "privnet.agent.datasets:digits",
    "breast-cancer": "privnet.agent.datasets:breast_cancer",
    "wine": "privnet.agent.datasets:wine",
}


def names() -> list[str]:
    """Every dataset this process can name: privnet's own and the registered ones."""
    return sorted({*BUILTIN, *plugins.entry_points("dataset")})


def check_name(name: str) -> None:
    """ConfigError unless `name` can name a dataset (syntax only; nothing is imported)."""
    if hubs.family(name):
        hubs.check_name(name)
    else:
        plugins.check_name("dataset", name)


@cache
def load(name: str) -> Dataset:
    """The named dataset, loaded once per process."""
    if hubs.family(name):
        x_train, y_train, x_test, y_test = hubs.load(name)
        if x_test is None or y_test is None:
            return split(x_train, y_train)
        return standardized(x_train, y_train, x_test, y_test)
    make = plugins.find("dataset", name, BUILTIN)
    data = make() if callable(make) else None
    if not isinstance(data, Dataset):
        raise ConfigError(
            f"dataset {name!r} must be a function returning privnet.agent.datasets.Dataset "
            f"(privnet.Dataset), got {type(data).__name__}"
        )
    return data
