"""Datasets from the user's own torchvision and Hugging Face caches: `torchvision:MNIST`,
`hf:NAME` (a hub name such as `mnist` or `ylecun/mnist`, or a directory written by
`datasets.Dataset.save_to_disk`).

Like every dataset, these load on each agent's machine and never download: a run must not
depend on a hub being up (nor tell it who trains on what), so a dataset missing from the
cache is an error that says how to fetch it once. Images become flat pixel rows, and every
dataset is standardized to privnet's `Dataset` (bias column last, labels 0..classes-1).
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from privnet.agent.spec import ConfigError

TORCHVISION, HF = "torchvision", "hf"
# torchvision:ClassName; hf: a hub name (org/name) or a path, no spaces or quotes
FORMS = {
    TORCHVISION: re.compile(r"[A-Za-z_]\w*"),
    HF: re.compile(r"[\w.~/+-]+"),
}
ROOT_VARIABLE = "PRIVNET_TORCHVISION_ROOT"  # where torchvision's datasets are kept
DEFAULT_ROOT = Path("~/.cache/torchvision")
LABEL = "label"  # a Hugging Face dataset's label column ("labels" also taken)


def family(name: str) -> str | None:
    """`torchvision` or `hf` when `name` is one of theirs, else None."""
    prefix, colon, _ = name.partition(":")
    return prefix if colon and prefix in FORMS else None


def check_name(name: str) -> None:
    """ConfigError unless `name` is a well-formed `torchvision:` or `hf:` name."""
    prefix, _, rest = name.partition(":")
    if not FORMS[prefix].fullmatch(rest):
        example = "torchvision:MNIST" if prefix == TORCHVISION else "hf:mnist or hf:/data/my-set"
        raise ConfigError(f"dataset {name!r}: write it as {example}")


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


def load(name: str) -> Arrays:
    """(x_train, y_train, x_test, y_test) of a `torchvision:` or `hf:` dataset, features
    flattened (a test split of None: the caller splits)."""
    check_name(name)
    prefix, _, rest = name.partition(":")
    return torchvision_arrays(rest) if prefix == TORCHVISION else hf_arrays(rest)


def root() -> Path:
    """torchvision's dataset directory: $PRIVNET_TORCHVISION_ROOT, else ~/.cache/torchvision."""
    return Path(os.environ.get(ROOT_VARIABLE) or DEFAULT_ROOT).expanduser()


def torchvision_arrays(name: str) -> Arrays:
    """A torchvision dataset class's train and test splits (`train=` or `split=`), from
    root() with download=False."""
    try:
        from torchvision import datasets as vision
    except ImportError:
        raise ConfigError(
            f"dataset torchvision:{name} needs torchvision: pip install 'privnet[torchvision]'"
        ) from None
    kind: Any = getattr(vision, name, None)
    if not inspect.isclass(kind):
        raise ConfigError(f"torchvision.datasets has no dataset {name!r} (e.g. MNIST, CIFAR10)")
    where, make = root(), cast(Callable[..., Any], kind)
    takes = inspect.signature(make).parameters
    if "train" in takes:
        splits: list[dict[str, Any]] = [{"train": True}, {"train": False}]
    elif "split" in takes:
        splits = [{"split": "train"}, {"split": "test"}]
    else:
        raise ConfigError(
            f"torchvision:{name} has neither train= nor split=: wrap it in a dataset "
            "plug-in of your own (module:function returning privnet.Dataset)"
        )
    arrays = []
    for split in splits:
        try:
            data = make(str(where), download=False, **split)
        except RuntimeError as exc:  # torchvision's "Dataset not found or corrupted"
            raise ConfigError(
                f"dataset torchvision:{name} is not in {where} ({exc}): fetch it once with "
                f"python -c \"import torchvision; torchvision.datasets.{name}('{where}', "
                f'download=True, **{split})" (or set {ROOT_VARIABLE} to where it is)'
            ) from None
        arrays += _vision_rows(data)
    x_train, y_train, x_test, y_test = arrays
    return x_train, y_train, x_test, y_test


def _vision_rows(data: Any) -> list[np.ndarray]:
    """(x, y) of one split: the `data`/`targets` (or `labels`) arrays most datasets keep,
    else every (image, label) item."""
    x, y = getattr(data, "data", None), getattr(data, "targets", getattr(data, "labels", None))
    if x is None or y is None:
        items = [data[i] for i in range(len(data))]
        x, y = [np.asarray(image) for image, _ in items], [label for _, label in items]
    x = np.asarray(x.numpy() if hasattr(x, "numpy") else x, dtype=float)
    y = np.asarray(y.numpy() if hasattr(y, "numpy") else y)
    return [x.reshape(len(x), -1), y.astype(np.int64)]


def hf_arrays(name: str) -> Arrays:
    """A Hugging Face dataset's train and test splits, offline: a directory of
    `save_to_disk`, else `load_dataset` from the user's cache."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # read when datasets is imported
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets as hf
    except ImportError:
        raise ConfigError(
            f"dataset hf:{name} needs the datasets package: pip install 'privnet[hf]'"
        ) from None
    hf.config.HF_DATASETS_OFFLINE = hf.config.HF_HUB_OFFLINE = True  # imported before us
    path = Path(name).expanduser()
    try:
        found = hf.load_from_disk(str(path)) if path.is_dir() else hf.load_dataset(name)
    except (FileNotFoundError, ConnectionError, ValueError) as exc:
        raise ConfigError(
            f"dataset hf:{name} is neither a directory of save_to_disk nor in the Hugging Face "
            f"cache ({type(exc).__name__}: {str(exc)[:200]}): fetch it once with python -c "
            f"\"import datasets; datasets.load_dataset('{name}')\" where the hub is reachable"
        ) from None
    if isinstance(found, hf.DatasetDict):
        if "train" not in found:
            raise ConfigError(f"dataset hf:{name} has no train split (it has {', '.join(found)})")
        train, test = found["train"], found.get("test")
    else:
        train, test = found, None
    x_train, y_train = _hf_rows(name, train)
    if test is None:
        return x_train, y_train, None, None
    x_test, y_test = _hf_rows(name, test)
    return x_train, y_train, x_test, y_test


def _hf_rows(name: str, split: Any) -> tuple[np.ndarray, np.ndarray]:
    """Labels from the `label` (or `labels`) column, features from every other column:
    numbers, arrays and images, each flattened."""
    columns = list(split.column_names)
    label = next((c for c in (LABEL, "labels") if c in columns), None)
    if label is None:
        raise ConfigError(
            f"dataset hf:{name} has no 'label' column (it has {', '.join(columns)}): rename "
            "the class column to 'label'"
        )
    # every row: column -> array (numpy's format would narrow float64 to float32 without dtype)
    frame = split.with_format("numpy", dtype=np.float64)[:]
    parts = []
    for column in (c for c in columns if c != label):
        values = np.asarray(frame[column])
        if values.dtype == object:  # images of several sizes, or ragged lists
            values = np.stack([np.asarray(v) for v in values])
        if not np.issubdtype(values.dtype, np.number):
            raise ConfigError(
                f"dataset hf:{name}: column {column!r} is {values.dtype}, not numbers or "
                "images; drop it (remove_columns) and save the dataset again"
            )
        parts.append(np.asarray(values, dtype=float).reshape(len(values), -1))
    return np.hstack(parts), np.asarray(frame[label]).astype(np.int64)
