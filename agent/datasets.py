"""Real data shipped with privnet (nothing is downloaded at run time): UCI Adult.

Agents load the same files as the orchestrator and take their own share, so raw data
never crosses the wire. Features: five numeric columns (standardized with the training
set's mean and std; capital gain/loss through log1p first), one-hot categoricals, US or
not, and a constant 1 for the bias. Labels are +1 (income > 50K) and -1.
"""

from __future__ import annotations

import csv
import io
import lzma
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data"
DATASETS = ("adult",)

_NUMERIC = (0, 4, 10, 11, 12)  # age, education-num, capital-gain, capital-loss, hours-per-week
_LOG = (10, 11)
_CATEGORICAL = (1, 5, 6, 7, 8, 9)  # workclass, marital, occupation, relationship, race, sex
_COUNTRY, _LABEL = 13, 14


@dataclass(frozen=True)
class Dataset:
    """Features with a bias column and +-1 labels, split as the dataset's authors split it."""

    x_train: np.ndarray  # (N, M)
    y_train: np.ndarray  # (N,)
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.x_train.shape[1])


def _rows(name: str) -> list[list[str]]:
    text = lzma.decompress((DATA / "adult" / name).read_bytes()).decode("ascii")
    rows = csv.reader(io.StringIO(text), skipinitialspace=True)
    return [r for r in rows if len(r) == _LABEL + 1]  # skips blanks and adult.test's header


@cache
def load(name: str) -> Dataset:
    """The named dataset, parsed once per process."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; shipped: {', '.join(DATASETS)}")
    train, test = _rows("adult.data.xz"), _rows("adult.test.xz")
    levels = [sorted({r[c] for r in train}) for c in _CATEGORICAL]

    def encode(rows: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        num = np.array([[float(r[c]) for c in _NUMERIC] for r in rows])
        for c in _LOG:
            num[:, _NUMERIC.index(c)] = np.log1p(num[:, _NUMERIC.index(c)])
        onehot = [
            np.array([[r[c] == v for v in lv] for r in rows], dtype=float)
            for c, lv in zip(_CATEGORICAL, levels, strict=True)
        ]
        us = np.array([[r[_COUNTRY] == "United-States"] for r in rows], dtype=float)
        label = np.array([1.0 if r[_LABEL].rstrip(".") == ">50K" else -1.0 for r in rows])
        return np.hstack([num, *onehot, us, np.ones((len(rows), 1))]), label

    x_train, y_train = encode(train)
    x_test, y_test = encode(test)
    k = len(_NUMERIC)
    mean, std = x_train[:, :k].mean(0), x_train[:, :k].std(0)
    x_train[:, :k] = (x_train[:, :k] - mean) / std
    x_test[:, :k] = (x_test[:, :k] - mean) / std
    for arr in (x_train, y_train, x_test, y_test):
        arr.setflags(write=False)
    return Dataset(x_train, y_train, x_test, y_test)
