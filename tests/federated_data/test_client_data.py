"""Per-client data: built once per spec, cached atomically, read back without the source."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from federated_data import (
    CIFAR100_COARSE_OF_FINE,
    ArrayDataset,
    ClientData,
    DataConfigError,
    DataSpec,
    SourceData,
    default_cache_dir,
    load_client_data,
    load_server_test_data,
    partition_labels,
    partition_summary,
    register_dataset,
    validate_spec,
)
from federated_data.client_data import SERVER_TEST

N_TOY = 600


def _toy_source(with_test: bool = False, num_labels: int = 10) -> SourceData:
    """Features [index, label] so that every example can be traced back to its source row."""
    labels = np.random.default_rng(0).permutation(np.arange(N_TOY) % num_labels).astype(np.int64)
    x = np.stack([np.arange(N_TOY), labels], axis=1).astype(np.float32)
    train = ArrayDataset(x, labels, num_labels)
    test = ArrayDataset(x[:7] + 1000, labels[:7], num_labels) if with_test else None
    return SourceData(train, test, keys=np.arange(N_TOY) % 5)


@pytest.fixture
def toy_calls() -> list[int]:
    """Registers 'toy' (no source cache, so every build calls the loader) and counts calls."""
    calls: list[int] = []

    def loader(data_dir: str | None, download: bool) -> SourceData:
        calls.append(1)
        return _toy_source()

    register_dataset("toy", loader)
    return calls


def _rows(data: ArrayDataset) -> np.ndarray:
    return data.x[:, 0].astype(np.int64)


def _same(a: ClientData, b: ClientData) -> bool:
    return all(
        np.array_equal(getattr(a, s).x, getattr(b, s).x)
        and np.array_equal(getattr(a, s).y, getattr(b, s).y)
        for s in ("train", "val", "test")
    )


SPEC = DataSpec("toy", 4, "dirichlet", 1, (("alpha", 0.5),), 0.1, 0.2)


def test_first_call_writes_every_client_and_later_calls_skip_the_source(
    toy_calls: list[int], tmp_path: Path
) -> None:
    first = load_client_data(SPEC, 2, tmp_path)
    assert toy_calls == [1]
    directory = tmp_path / SPEC.key()
    clients = [f"client-{i}.npz" for i in range(4)]
    assert sorted(p.name for p in directory.glob("*.npz")) == [*clients, SERVER_TEST]
    assert (directory / "manifest.json").is_file()
    again = load_client_data(SPEC, 2, tmp_path)
    other = load_client_data(SPEC, 0, str(tmp_path))
    assert toy_calls == [1]
    assert _same(first, again) and not _same(first, other)
    assert first.client_id == 2 and other.client_id == 0


def test_client_splits_are_disjoint_sized_and_follow_the_partition(
    toy_calls: list[int], tmp_path: Path
) -> None:
    source = _toy_source()
    parts = partition_labels(source.train.y, "dirichlet", 4, 1, alpha=0.5)
    seen: list[np.ndarray] = []
    for cid, part in enumerate(parts):
        data = load_client_data(SPEC, cid, tmp_path)
        train, val, test = _rows(data.train), _rows(data.val), _rows(data.test)
        assert len(test) == int(np.floor(0.2 * len(part) + 0.5))
        assert len(val) == int(np.floor(0.1 * len(part) + 0.5))
        everything = np.concatenate([train, val, test])
        assert len(set(everything.tolist())) == len(everything)
        assert sorted(everything.tolist()) == part.tolist()
        for split in (data.train, data.val, data.test):
            np.testing.assert_array_equal(split.y, split.x[:, 1].astype(np.int64))
        seen.append(everything)
    assert sorted(np.concatenate(seen).tolist()) == list(range(N_TOY))


def test_builds_are_identical_across_cache_dirs(toy_calls: list[int], tmp_path: Path) -> None:
    for cid in range(4):
        a = load_client_data(SPEC, cid, tmp_path / "a")
        b = load_client_data(SPEC, cid, tmp_path / "b")
        assert _same(a, b)
    manifest_a = json.loads((tmp_path / "a" / SPEC.key() / "manifest.json").read_text())
    manifest_b = json.loads((tmp_path / "b" / SPEC.key() / "manifest.json").read_text())
    assert manifest_a == manifest_b


def test_different_seeds_give_different_clients(toy_calls: list[int], tmp_path: Path) -> None:
    other = DataSpec("toy", 4, "dirichlet", 2, (("alpha", 0.5),), 0.1, 0.2)
    assert not _same(load_client_data(SPEC, 0, tmp_path), load_client_data(other, 0, tmp_path))


def test_key_covers_what_changes_the_partition_and_nothing_else() -> None:
    base = DataSpec("mnist-5k", 3)
    assert base.key() == "fa9b56c18ac989de"  # stable across processes and releases
    assert len(base.key()) == 16 and int(base.key(), 16) >= 0
    same = [
        DataSpec("mnist-5k", 3, data_dir="/data", download=True),
        DataSpec("mnist-5k", 3, val_fraction=0.1, test_fraction=0.2),
    ]
    assert {s.key() for s in same} == {base.key()}
    different = [
        DataSpec("digits", 3),
        DataSpec("mnist-5k", 4),
        DataSpec("mnist-5k", 3, seed=1),
        DataSpec("mnist-5k", 3, partitioner="dirichlet", params=(("alpha", 0.5),)),
        DataSpec("mnist-5k", 3, val_fraction=0.0),
        DataSpec("mnist-5k", 3, test_fraction=0.25),
    ]
    keys = {s.key() for s in different}
    assert len(keys) == len(different) and base.key() not in keys
    a = DataSpec("x", 3, "label-groups", params=(("groups", 3), ("alpha", 1.0)))
    b = DataSpec("x", 3, "label-groups", params=(("alpha", 1), ("groups", 3)))
    assert a.params == (("alpha", 1.0), ("groups", 3)) and a.key() == b.key()


def test_manifest_summary_matches_the_client_files(toy_calls: list[int], tmp_path: Path) -> None:
    summary = partition_summary(SPEC, tmp_path)
    assert summary["spec"] == SPEC.to_dict() and summary["key"] == SPEC.key()
    assert summary["num_classes"] == 10 and summary["has_official_test"] is False
    assert len(summary["clients"]) == 4
    total = 0
    for cid, entry in enumerate(summary["clients"]):
        data = load_client_data(SPEC, cid, tmp_path)
        for split in ("train", "val", "test"):
            part = getattr(data, split)
            assert entry[split] == len(part)
            assert entry[f"{split}_labels"] == part.label_counts().tolist()
            total += len(part)
    assert total == N_TOY
    assert DataSpec.from_dict(summary["spec"]) == SPEC
    assert toy_calls == [1]


def test_server_test_data_without_official_split_joins_client_tests(
    toy_calls: list[int], tmp_path: Path
) -> None:
    joined = load_server_test_data(SPEC, tmp_path)
    assert joined is not None
    tests = [load_client_data(SPEC, cid, tmp_path).test for cid in range(4)]
    np.testing.assert_array_equal(joined.x, np.concatenate([t.x for t in tests]))
    assert len(joined) == sum(len(t) for t in tests) > 0
    no_test = DataSpec("toy", 4, "iid", 1, (), 0.1, 0.0)
    assert load_server_test_data(no_test, tmp_path) is None


def test_server_test_data_prefers_the_official_split(tmp_path: Path) -> None:
    register_dataset("toy-with-test", lambda d, dl: _toy_source(with_test=True), cache=True)
    spec = DataSpec("toy-with-test", 3)
    official = load_server_test_data(spec, tmp_path)
    assert official is not None and len(official) == 7
    np.testing.assert_array_equal(official.x, _toy_source(with_test=True).test.x)  # type: ignore[union-attr]
    # the official test split is not partitioned: clients hold only training rows
    rows = np.concatenate(
        [
            _rows(getattr(load_client_data(spec, c, tmp_path), s))
            for c in range(3)
            for s in ("train", "val", "test")
        ]
    )
    assert sorted(rows.tolist()) == list(range(N_TOY))


@pytest.mark.parametrize("cid", [-1, 4, 100, True, "1", 1.0])
def test_client_id_outside_range_is_refused_before_loading(
    toy_calls: list[int], tmp_path: Path, cid: Any
) -> None:
    with pytest.raises(DataConfigError, match="client_id"):
        load_client_data(SPEC, cid, tmp_path)
    assert toy_calls == [] and not (tmp_path / SPEC.key()).exists()


def _truncate_half(size: int) -> int:
    return size // 2


@pytest.mark.parametrize("keep", [lambda s: 0, lambda s: 10, _truncate_half, lambda s: s - 1])
def test_truncated_client_file_is_an_error_naming_it(
    toy_calls: list[int], tmp_path: Path, keep: Any
) -> None:
    load_client_data(SPEC, 0, tmp_path)
    path = tmp_path / SPEC.key() / "client-1.npz"
    payload = path.read_bytes()
    path.write_bytes(payload[: keep(len(payload))])
    with pytest.raises(DataConfigError, match=f"{re.escape(str(path))}.*delete the directory"):
        load_client_data(SPEC, 1, tmp_path)
    assert path.stat().st_size < len(payload), "must not regenerate over a complete cache"
    assert toy_calls == [1]
    load_client_data(SPEC, 2, tmp_path)  # other clients are unaffected


def test_missing_client_file_with_manifest_is_an_error(
    toy_calls: list[int], tmp_path: Path
) -> None:
    load_client_data(SPEC, 0, tmp_path)
    path = tmp_path / SPEC.key() / "client-3.npz"
    path.unlink()
    with pytest.raises(DataConfigError, match=re.escape(str(path))):
        load_client_data(SPEC, 3, tmp_path)


def test_cache_without_manifest_is_rebuilt(toy_calls: list[int], tmp_path: Path) -> None:
    expected = load_client_data(SPEC, 1, tmp_path)
    directory = tmp_path / SPEC.key()
    (directory / "manifest.json").unlink()
    (directory / "client-1.npz").write_bytes(b"half-written")
    (directory / ".tmp-leftover.npz").write_bytes(b"from a writer that died")
    rebuilt = load_client_data(SPEC, 1, tmp_path)
    assert toy_calls == [1, 1]
    assert _same(expected, rebuilt)
    assert (directory / "manifest.json").is_file()
    assert not list(directory.glob(".tmp-*"))


def test_invalid_partition_settings_fail_before_the_source_loads(
    toy_calls: list[int], tmp_path: Path
) -> None:
    bad = DataSpec("toy", 4, "dirichlet", 0, (("alpha", -1.0),))
    with pytest.raises(DataConfigError, match="alpha"):
        load_client_data(bad, 0, tmp_path)
    with pytest.raises(DataConfigError, match="groups"):
        load_client_data(
            DataSpec("toy", 4, "label-groups", 0, (("alpha", 1), ("groups", 0))), 0, tmp_path
        )
    assert toy_calls == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            DataSpec("mnist-5k", 3, "classes", params=(("classes_per_client", 11),)),
            r"classes_per_client must be in \[1, 10\]",
        ),
        (DataSpec("mnist-5k", 3, "pachinko"), "pachinko.*coarse_of_fine.*'mnist-5k'"),
        (DataSpec("mnist-5k", 3, "natural"), None),
        (
            DataSpec("mnist-5k", 6, "one-class", params=(("classes_per_client", 2),)),
            "num_clients \\* classes_per_client",
        ),
        (DataSpec("imagenet", 3), "unknown dataset 'imagenet'; valid names: .*mnist-5k"),
        (DataSpec("mnist-5k", 3, "shuffle"), "unknown partitioner 'shuffle'"),
    ],
)
def test_validate_spec_checks_without_loading(
    tmp_path: Path, source_cache: Path, spec: DataSpec, message: str | None
) -> None:
    if message is None:  # natural keys come with the data, so only loading can refuse it
        validate_spec(spec)
        with pytest.raises(DataConfigError, match="'natural' needs one key per example"):
            load_client_data(spec, 0, source_cache)
        assert not (source_cache / spec.key() / "manifest.json").exists()
        return
    with pytest.raises(DataConfigError, match=message):
        validate_spec(spec)
    with pytest.raises(DataConfigError, match=message):
        load_client_data(spec, 0, tmp_path)
    assert not (tmp_path / "sources").exists()


def test_cifar100_pachinko_is_accepted_by_validate_spec() -> None:
    validate_spec(DataSpec("cifar100", 10, "pachinko", params=(("alpha", 0.1), ("beta", 5.0))))


def test_pachinko_and_natural_take_their_arrays_from_the_dataset(tmp_path: Path) -> None:
    register_dataset(
        "toy100", lambda d, dl: _toy_source(num_labels=100), coarse_of_fine=CIFAR100_COARSE_OF_FINE
    )
    spec = DataSpec("toy100", 6, "pachinko", 3, (("alpha", 0.3),), 0.0, 0.0)
    sizes = [len(load_client_data(spec, c, tmp_path).train) for c in range(6)]
    assert sizes == [N_TOY // 6] * 6

    register_dataset("toy-writers", lambda d, dl: _toy_source())
    natural = DataSpec("toy-writers", 3, "natural", 0, (), 0.0, 0.0)
    for cid in range(3):
        rows = _rows(load_client_data(natural, cid, tmp_path).train)
        assert set((rows % 5).tolist()) == {cid} and len(rows) == N_TOY // 5


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_clients": 0}, "num_clients must be >= 1"),
        ({"num_clients": 2.0}, "num_clients must be an integer"),
        ({"seed": -3}, "seed must be >= 0"),
        ({"val_fraction": 1.0}, r"val_fraction must be a number in \[0, 1\)"),
        ({"test_fraction": -0.1}, "test_fraction"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "val_fraction \\+ test_fraction"),
        ({"params": (("alpha", 1.0), ("alpha", 2.0))}, "'alpha' given twice"),
        ({"params": (("alpha", [1.0]),)}, "alpha must be an int, float or str"),
        ({"params": ("alpha",)}, "pairs"),
        ({"dataset": ""}, "dataset"),
    ],
)
def test_malformed_specs_are_refused(fields: dict[str, Any], message: str) -> None:
    raw: dict[str, Any] = {"dataset": "mnist-5k", "num_clients": 3, **fields}
    with pytest.raises(DataConfigError, match=message):
        DataSpec(**raw)


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLLEN_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("POLLEN_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "pollen"


# --- processes --------------------------------------------------------------------------------


def _digest(data: ClientData) -> str:
    h = hashlib.sha256()
    for split in (data.train, data.val, data.test):
        h.update(split.x.tobytes())
        h.update(split.y.tobytes())
    return h.hexdigest()


def _race(spec: dict[str, Any], cid: int, cache_dir: str, barrier: Any, out: Any) -> None:
    barrier.wait(timeout=60)
    try:
        out.put((cid, _digest(load_client_data(DataSpec.from_dict(spec), cid, cache_dir))))
    except BaseException as exc:
        out.put((cid, f"error: {exc!r}"))


def test_concurrent_first_calls_from_three_processes_agree(tmp_path: Path) -> None:
    spec = DataSpec("digits", 3, "dirichlet", 7, (("alpha", 1.0),))
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    shared = tmp_path / "shared"
    procs = [
        ctx.Process(target=_race, args=(spec.to_dict(), cid, str(shared), barrier, out))
        for cid in range(3)
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0

    directory = shared / spec.key()
    assert sorted(os.listdir(directory)) == [
        ".lock",
        "client-0.npz",
        "client-1.npz",
        "client-2.npz",
        "manifest.json",
        SERVER_TEST,
    ]
    assert [p.name for p in (shared / "sources").iterdir() if p.suffix == ".npz"] == [
        "digits.v1.npz"
    ]
    # Reference: the same partition built by one process (from the converted source, to skip
    # re-importing scikit-learn here).
    shutil.copytree(shared / "sources", tmp_path / "alone" / "sources")
    for cid in range(3):
        alone = load_client_data(spec, cid, tmp_path / "alone")
        assert results[cid] == _digest(alone)
        assert _digest(load_client_data(spec, cid, shared)) == _digest(alone)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert sum(c["train"] + c["val"] + c["test"] for c in manifest["clients"]) == 1797


def test_cached_mnist_5k_loads_in_a_fresh_interpreter_without_frameworks(
    source_cache: Path,
) -> None:
    spec = DataSpec("mnist-5k", 5, "iid", 0)
    expected = load_client_data(spec, 1, source_cache)
    assert (
        sum(
            c["train"] + c["val"] + c["test"]
            for c in partition_summary(spec, source_cache)["clients"]
        )
        == 5000
    )
    code = (
        "import json, sys\n"
        "from federated_data import DataSpec, load_client_data\n"
        "spec = DataSpec.from_dict(json.loads(sys.argv[1]))\n"
        "data = load_client_data(spec, 1, sys.argv[2])\n"
        "x = data.train.features()\n"
        "heavy = [m for m in ('torch', 'torchvision', 'sklearn', 'mlxtend') if m in sys.modules]\n"
        "total = int(data.train.x.sum())\n"
        "print(json.dumps({'heavy': heavy, 'shape': list(x.shape), 'sum': total}))\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec.to_dict()), str(source_cache)],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    report = json.loads(done.stdout)
    assert report["heavy"] == []
    assert report["shape"] == [len(expected.train), 1, 28, 28]
    assert report["sum"] == int(expected.train.x.sum())


def _split_source() -> SourceData:
    """Toy rows keyed by row % 3, every fourth row marked as its key's test example."""
    source = _toy_source()
    mask = np.arange(N_TOY) % 4 == 0
    return SourceData(source.train, None, np.arange(N_TOY) % 3, mask)


def test_predefined_split_gives_marked_rows_as_test_and_carves_val_from_the_rest(
    tmp_path: Path,
) -> None:
    register_dataset("toy-split", lambda d, dl: _split_source(), predefined_split=True)
    spec = DataSpec("toy-split", 3, "natural", 4, (), 0.2, 0.5)
    seen: list[int] = []
    for cid in range(3):
        data = load_client_data(spec, cid, tmp_path)
        test, train, val = _rows(data.test), _rows(data.train), _rows(data.val)
        own = np.flatnonzero(np.arange(N_TOY) % 3 == cid)
        assert test.tolist() == [r for r in own.tolist() if r % 4 == 0]  # test_fraction unused
        rest = [r for r in own.tolist() if r % 4 != 0]
        assert sorted([*train.tolist(), *val.tolist()]) == rest
        assert len(val) == int(np.floor(0.2 * len(rest) + 0.5))
        seen += [*train.tolist(), *val.tolist(), *test.tolist()]
    assert sorted(seen) == list(range(N_TOY))
    with pytest.raises(DataConfigError, match=r"predefined split.*needs partitioner 'natural'"):
        validate_spec(DataSpec("toy-split", 3, "iid"))


def test_a_test_mask_without_the_natural_partitioner_is_refused_at_build(
    tmp_path: Path,
) -> None:
    register_dataset("toy-mask", lambda d, dl: _split_source())  # mask not declared up front
    spec = DataSpec("toy-mask", 3, "iid")
    validate_spec(spec)
    with pytest.raises(DataConfigError, match=r"'toy-mask'.*needs partitioner 'natural'"):
        load_client_data(spec, 0, tmp_path)
    assert not (tmp_path / spec.key() / "manifest.json").exists()


def test_pool_test_and_subsample_change_the_key_only_when_set() -> None:
    base = DataSpec("mnist-5k", 3)
    assert DataSpec("mnist-5k", 3, pool_test=False, subsample=1.0).key() == base.key()
    keys = {
        DataSpec("mnist-5k", 3, pool_test=True).key(),
        DataSpec("mnist-5k", 3, subsample=0.5).key(),
        DataSpec("mnist-5k", 3, pool_test=True, subsample=0.5).key(),
    }
    assert len(keys) == 3 and base.key() not in keys
    assert DataSpec("mnist-5k", 3, subsample=1).key() == base.key()  # 1 and 1.0 agree
    spec = DataSpec("mnist-5k", 3, pool_test=True, subsample=0.25)
    assert DataSpec.from_dict(spec.to_dict()) == spec


def _all_rows(spec: DataSpec, root: Path) -> np.ndarray:
    return np.concatenate([
        _rows(getattr(load_client_data(spec, c, root), s))
        for c in range(spec.num_clients)
        for s in ("train", "val", "test")
    ])  # fmt: skip


def test_pool_test_partitions_the_official_test_set_with_the_training_set(
    tmp_path: Path,
) -> None:
    register_dataset("toy-with-test", lambda d, dl: _toy_source(with_test=True), cache=True)
    spec = DataSpec("toy-with-test", 3, pool_test=True)
    rows = _all_rows(spec, tmp_path)
    assert sorted(rows.tolist()) == list(range(N_TOY)) + [1000 + i for i in range(7)]
    summary = partition_summary(spec, tmp_path)
    assert summary["has_official_test"] is False and summary["source_train_size"] == N_TOY + 7
    joined = load_server_test_data(spec, tmp_path)  # the clients' test splits, as without one
    tests = [load_client_data(spec, c, tmp_path).test for c in range(3)]
    assert joined is not None
    np.testing.assert_array_equal(joined.x, np.concatenate([t.x for t in tests]))


def test_subsample_keeps_a_seeded_random_share_before_partitioning(
    toy_calls: list[int], tmp_path: Path
) -> None:
    spec = DataSpec("toy", 4, "iid", 1, (), 0.0, 0.5, subsample=0.25)
    rows = _all_rows(spec, tmp_path / "a")
    assert len(rows) == len(set(rows.tolist())) == N_TOY // 4
    assert set(rows.tolist()) <= set(range(N_TOY))
    again = _all_rows(spec, tmp_path / "b")  # another cache, the same draw
    np.testing.assert_array_equal(np.sort(rows), np.sort(again))
    other_seed = _all_rows(DataSpec("toy", 4, "iid", 2, (), 0.0, 0.5, subsample=0.25), tmp_path)
    assert set(other_seed.tolist()) != set(rows.tolist())
    for c in range(4):  # then each client's test_fraction (0.5) as usual
        data = load_client_data(spec, c, tmp_path / "a")
        assert len(data.test) == int(0.5 * (len(data.train) + len(data.test)) + 0.5)


def test_pool_test_and_subsample_are_refused_for_a_predefined_split(tmp_path: Path) -> None:
    for extra in ({"pool_test": True}, {"subsample": 0.5}):
        spec = DataSpec("fedem-synthetic", 3, "natural", **extra)  # type: ignore[arg-type]
        with pytest.raises(DataConfigError, match="predefined split"):
            validate_spec(spec)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"subsample": 0.0}, r"subsample must be a number in \(0, 1\]"),
        ({"subsample": 1.5}, "subsample"),
        ({"subsample": True}, "subsample"),
        ({"pool_test": "yes"}, "pool_test must be true or false"),
    ],
)
def test_malformed_pooling_and_subsampling_are_refused(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(DataConfigError, match=message):
        DataSpec("mnist-5k", 3, **fields)


def test_server_test_data_is_one_file_written_with_the_partition(
    toy_calls: list[int], tmp_path: Path
) -> None:
    """The server reads one file (SERVER_TEST), not one per client; a partition cached before
    that file existed gets it on the server's first read, with the same contents."""
    joined = load_server_test_data(SPEC, tmp_path)
    directory = tmp_path / SPEC.key()
    assert joined is not None and (directory / SERVER_TEST).is_file()
    tests = [load_client_data(SPEC, cid, tmp_path).test for cid in range(4)]
    for cid in range(4):  # the clients' files are not read again
        (directory / f"client-{cid}.npz").rename(directory / f"moved-{cid}")
    again = load_server_test_data(SPEC, tmp_path)
    assert again is not None
    np.testing.assert_array_equal(again.x, np.concatenate([t.x for t in tests]))
    np.testing.assert_array_equal(again.y, np.concatenate([t.y for t in tests]))
    assert (again.num_classes, again.mean, again.std) == (
        tests[0].num_classes, tests[0].mean, tests[0].std,
    )  # fmt: skip
    for cid in range(4):
        (directory / f"moved-{cid}").rename(directory / f"client-{cid}.npz")
    (directory / SERVER_TEST).unlink()  # as an earlier version cached the partition
    rebuilt = load_server_test_data(SPEC, tmp_path)
    assert rebuilt is not None and (directory / SERVER_TEST).is_file()
    np.testing.assert_array_equal(rebuilt.x, again.x)
    np.testing.assert_array_equal(rebuilt.y, again.y)
    assert toy_calls == [1]  # the source was loaded once, for the partition


def test_a_damaged_server_test_file_is_one_line_naming_it(
    toy_calls: list[int], tmp_path: Path
) -> None:
    load_server_test_data(SPEC, tmp_path)
    damaged = tmp_path / SPEC.key() / SERVER_TEST
    damaged.write_bytes(b"not a zip")
    with pytest.raises(DataConfigError, match=f"cached partition file {damaged} is unreadable"):
        load_server_test_data(SPEC, tmp_path)
