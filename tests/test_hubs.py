"""`dataset = "hf:NAME"` and `"torchvision:NAME"`: the user's cached datasets, offline.

Hugging Face: a tiny dataset written with `save_to_disk` (numbers and images), loaded back
and run. torchvision: a tiny MNIST in its own raw idx format under a root of the test's;
those tests need torchvision, which PyPI ships built against one torch release only (the
machine's torch 2.13.0 has none): they run where torchvision imports, and skip elsewhere.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

import privnet
from privnet.agent import datasets, hubs
from privnet.agent.spec import ConfigError

hf = pytest.importorskip("datasets")
ROWS, TEST_ROWS, SIDE = 64, 24, 6


def _images(rows: int, seed: int, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(rows, SIDE, SIDE) uint8 images whose mean brightness tells their class (0, 1, ...)."""
    gen = np.random.default_rng(seed)
    labels = np.arange(rows) % classes
    pixels = gen.integers(0, 80, size=(rows, SIDE, SIDE)) + 60 * labels[:, None, None]
    return pixels.astype(np.uint8), labels


def _saved(tmp_path: Path, classes: int = 3) -> Path:
    """A DatasetDict (train, test) of two number columns, an image and a label, on disk."""
    features = hf.Features(
        {
            "size": hf.Value("float64"),
            "pair": hf.Sequence(hf.Value("float32"), length=2),
            "image": hf.Image(),
            "label": hf.ClassLabel(names=["a", "b", "c"][:classes]),
        }
    )
    splits = {}
    for split, rows, seed in (("train", ROWS, 1), ("test", TEST_ROWS, 2)):
        images, labels = _images(rows, seed, classes)
        splits[split] = hf.Dataset.from_dict(
            {
                "size": np.linspace(0, 1, rows) + labels,
                "pair": np.stack([labels, -labels], axis=1).astype(np.float32) + 0.5,
                "image": list(images),
                "label": labels,
            },
            features=features,
        )
    path = tmp_path / "tiny-set"
    hf.DatasetDict(splits).save_to_disk(str(path))
    return path


def _expected(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    images, labels = _images(rows, seed)
    size = np.linspace(0, 1, rows) + labels
    pair = np.stack([labels, -labels], axis=1) + 0.5
    return np.hstack([size[:, None], pair, images.reshape(rows, -1)]), labels


def test_hf_dataset_saved_to_disk_loads_as_its_arrays(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    data = datasets.load(f"hf:{path}")
    x_train, y_train = _expected(ROWS, 1)
    x_test, y_test = _expected(TEST_ROWS, 2)
    want = privnet.standardized(x_train, y_train, x_test, y_test)
    assert data.classes == 3 and data.dim == 1 + 2 + SIDE * SIDE + 1
    np.testing.assert_allclose(data.x_train, want.x_train, rtol=1e-12)
    np.testing.assert_allclose(data.x_test, want.x_test, rtol=1e-12)
    np.testing.assert_array_equal(data.y_train, y_train)
    np.testing.assert_array_equal(data.y_test, y_test)


def test_hf_dataset_runs_an_experiment(tmp_path: Path) -> None:
    path = _saved(tmp_path, classes=2)
    exp = privnet.Experiment(
        problem="logistic",
        dataset=f"hf:{path}",
        agents=4,
        samples=12,
        iters=30,
        strategies="atc",
        schemes="none",
        mu=0.5,
        seed=3,
    )
    result = privnet.simulate(exp, "memory")
    assert result.config.dim == 1 + 2 + SIDE * SIDE + 1  # the features, flattened, and a bias
    assert result.metric("test_error_centroid")[0][-1] <= 0.1  # the classes are separable


def test_hf_single_split_is_split_by_the_fixed_rule(tmp_path: Path) -> None:
    labels = np.arange(40) % 2
    hf.Dataset.from_dict({"x": labels * 2.0 + np.arange(40) / 40, "label": labels}).save_to_disk(
        str(tmp_path / "one")
    )
    data = datasets.load(f"hf:{tmp_path / 'one'}")
    assert (len(data.y_train), len(data.y_test)) == (30, 10)  # TEST_FRACTION of each class


def test_hf_errors_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fetch it once"):
        hubs.load("hf:privnet-test/not-in-any-cache")
    hf.Dataset.from_dict({"x": [1.0, 2.0], "y": [0, 1]}).save_to_disk(str(tmp_path / "nolabel"))
    with pytest.raises(ConfigError, match="no 'label' column"):
        hubs.load(f"hf:{tmp_path / 'nolabel'}")
    hf.Dataset.from_dict({"t": ["a", "b"], "label": [0, 1]}).save_to_disk(str(tmp_path / "text"))
    with pytest.raises(ConfigError, match="column 't'"):
        hubs.load(f"hf:{tmp_path / 'text'}")
    with pytest.raises(ConfigError, match="write it as hf:mnist"):
        privnet.Experiment(problem="logistic", dataset="hf:has space")
    with pytest.raises(ConfigError, match="write it as torchvision:MNIST"):
        privnet.Experiment(problem="logistic", dataset="torchvision:not/a/class")


def _idx(path: Path, array: np.ndarray) -> None:
    """One file of MNIST's idx format (uint8: type code 0x08), gzipped as distributed."""
    head = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(head + array.astype(np.uint8).tobytes())
    with gzip.open(f"{path}.gz", "wb") as fh:
        fh.write(path.read_bytes())


def _mnist(root: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    made = {}
    for prefix, rows, seed in (("train", ROWS, 1), ("t10k", TEST_ROWS, 2)):
        gen = np.random.default_rng(seed)
        images = gen.integers(0, 256, size=(rows, 28, 28)).astype(np.uint8)
        labels = gen.integers(0, 10, size=rows).astype(np.uint8)
        _idx(raw / f"{prefix}-images-idx3-ubyte", images)
        _idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
        made[prefix] = (images, labels)
    return made


def test_torchvision_mnist_from_a_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torchvision")
    made = _mnist(tmp_path / "vision")
    monkeypatch.setenv(hubs.ROOT_VARIABLE, str(tmp_path / "vision"))
    x_train, y_train, x_test, y_test = hubs.load("torchvision:MNIST")
    assert x_test is not None and y_test is not None
    np.testing.assert_array_equal(x_train, made["train"][0].reshape(ROWS, -1))
    np.testing.assert_array_equal(y_train, made["train"][1])
    np.testing.assert_array_equal(x_test, made["t10k"][0].reshape(TEST_ROWS, -1))
    np.testing.assert_array_equal(y_test, made["t10k"][1])
    data = datasets.load("torchvision:MNIST")
    assert data.dim == 28 * 28 + 1 and len(data.y_train) == ROWS


def test_torchvision_not_in_the_cache_says_how_to_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torchvision")
    monkeypatch.setenv(hubs.ROOT_VARIABLE, str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match=r"download=True") as caught:
        hubs.load("torchvision:FashionMNIST")
    assert str(tmp_path / "empty") in str(caught.value)
    with pytest.raises(ConfigError, match="has no dataset 'NoSuchSet'"):
        hubs.load("torchvision:NoSuchSet")
