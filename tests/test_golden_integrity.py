"""A damaged golden file is refused as damaged, naming the file and what in it is
damaged, never read as a kernel failure: each dataset carries a SHA-256 checksum
that the reader verifies; a file that is not HDF5, is truncated or lacks a group
is refused too. On the command line each is exit 2."""

import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

import conformance.__main__ as cli
import conformance.golden as golden
from conformance.golden import DEFAULT_PATH, SCHEMA_VERSION, GoldenFileError, GoldenStore, checksum
from kernels.runtime.core import BFLOAT16

from .conftest import load_store, run_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPECTED = "transpose/2d_3x5/expected/output"
TRANSPOSE = ["--device", "cpu", "--op", "transpose"]


def copy_of_goldens(tmp_path):
    path = tmp_path / "goldens.h5"
    shutil.copyfile(DEFAULT_PATH, path)
    return str(path)


def flip_byte(path, dataset, index=0):
    """One bit flipped in byte `index` of a dataset's raw data, as a bad disk or a bad copy would."""
    with h5py.File(path, "r") as store:
        offset = store[dataset].id.get_offset()
        assert offset is not None, f"{dataset} has no contiguous storage to damage"
    with open(path, "r+b") as file:
        file.seek(offset + index)
        byte = file.read(1)[0]
        file.seek(offset + index)
        file.write(bytes([byte ^ 0x10]))


def run(capsys, *argv):
    return run_main(capsys, cli.main, argv)


# --------------------------------------------------------------------------- the checksum


def test_every_dataset_of_the_committed_file_carries_a_matching_checksum():
    datasets = []
    with h5py.File(DEFAULT_PATH, "r") as store:
        assert store.attrs["schema_version"] == SCHEMA_VERSION
        store.visititems(lambda name, item: datasets.append(item) if isinstance(item, h5py.Dataset) else None)
        assert len(datasets) > 1000
        unsealed = [d.name for d in datasets if d.attrs.get("sha256") != golden.stored_checksum(d)]
        assert unsealed == []


def test_checksum_covers_dtype_shape_and_bytes():
    values = np.arange(6, dtype=np.float32)
    base = checksum(values)
    assert len(base) == 64 and base == checksum(values.copy())
    assert checksum(values.reshape(2, 3)) != base
    assert checksum(values.reshape(2, 3)) != checksum(values.reshape(3, 2))
    assert checksum(values.view(np.int32)) != base  # the same bytes read as another dtype
    flipped = values.copy()
    flipped.view(np.uint8)[5] ^= 1
    assert checksum(flipped) != base
    # A byte order is a storage detail: the same values big-endian have the same checksum.
    assert checksum(values.astype(">f4")) == base
    half = np.array([1.0, -2.5], dtype=BFLOAT16)
    assert checksum(half) != checksum(half.view(np.uint16))


def test_a_bfloat16_dataset_that_lost_its_dtype_attribute_is_damaged(tmp_path):
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as store:
        golden._dataset(store, "b", np.array([1.0, -2.5], dtype=BFLOAT16))
    with h5py.File(path, "r+") as store:
        del store["b"].attrs["dtype"]  # read back it would be uint16 bit patterns, not values
    with h5py.File(path, "r") as store, pytest.raises(GoldenFileError) as raised:
        golden._read(store["b"])
    assert raised.value.path == str(path) and raised.value.datasets == ("/b",)
    assert str(raised.value).startswith(f"damaged golden file {path}: dataset /b does not match its sha256 checksum")


def test_a_dataset_without_a_checksum_is_damaged(tmp_path):
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as store:
        golden._dataset(store, "x", np.arange(3.0))
        del store["x"].attrs["sha256"]
    with h5py.File(path, "r") as store, pytest.raises(GoldenFileError, match="dataset /x has no sha256 checksum"):
        golden._read(store["x"])


def test_seal_makes_an_edited_dataset_whole_again(tmp_path):
    path = copy_of_goldens(tmp_path)
    with h5py.File(path, "r+") as store:
        dataset = store[EXPECTED]
        dataset[0, 0] += 1
        assert dataset.attrs["sha256"] != golden.stored_checksum(dataset)
        golden.seal(dataset)
    store = GoldenStore(path)
    assert store.goldens["transpose/2d_3x5"].expected["output"][0, 0] == GoldenStore().goldens[
        "transpose/2d_3x5"].expected["output"][0, 0] + 1


# --------------------------------------------------------------------------- the store


@pytest.mark.parametrize("dataset", [EXPECTED, "transpose/2d_3x5/inputs/input", "softmax/yolov10_dfl_bf16/expected/input_grad"])
def test_one_flipped_byte_is_refused_naming_file_and_dataset(tmp_path, dataset):
    path = copy_of_goldens(tmp_path)
    flip_byte(path, dataset, index=1)
    with pytest.raises(GoldenFileError) as raised:
        GoldenStore(path)
    assert raised.value.path == path and raised.value.datasets == (f"/{dataset}",)
    assert str(raised.value).startswith(
        f"damaged golden file {path}: dataset /{dataset} does not match its sha256 checksum")


def test_every_damaged_dataset_is_named(tmp_path):
    path = copy_of_goldens(tmp_path)
    damaged = [EXPECTED, "transpose/2d_3x5/inputs/input", "softmax/yolov10_dfl_bf16/expected/input_grad"]
    for dataset in damaged:
        flip_byte(path, dataset)
    with pytest.raises(GoldenFileError) as raised:
        GoldenStore(path)
    assert sorted(raised.value.datasets) == sorted(f"/{d}" for d in damaged)
    assert "3 datasets do not match their sha256 checksums" in str(raised.value)


def test_an_older_schema_without_checksums_is_stale_not_damaged(tmp_path):
    path = copy_of_goldens(tmp_path)
    with h5py.File(path, "r+") as store:
        store.attrs["schema_version"] = 2
        store.visititems(lambda name, item: item.attrs.__delitem__("sha256") if isinstance(item, h5py.Dataset) else None)
    store = GoldenStore(path)
    assert store.staleness() == (f"{path} has schema 2, expected {SCHEMA_VERSION}: "
                                 "regenerate it with `python generate_goldens.py`")


def test_a_missing_file_is_stale_naming_it(tmp_path):
    path = str(tmp_path / "nothing.h5")
    assert GoldenStore(path).staleness() == (f"{path} is missing or empty: "
                                             "regenerate it with `python generate_goldens.py`")


def test_pytest_reports_a_damaged_file_as_such(tmp_path):
    """The store fixture turns the error into a plain test failure (no traceback into h5py)."""
    path = copy_of_goldens(tmp_path)
    flip_byte(path, EXPECTED)
    with pytest.raises(pytest.fail.Exception) as raised:
        load_store(path)
    assert str(raised.value).startswith(f"damaged golden file {path}: dataset /{EXPECTED}")
    assert not raised.value.pytrace
    assert load_store(DEFAULT_PATH).path == DEFAULT_PATH


# --------------------------------------------------------------------------- the command line


def test_a_flipped_byte_exits_2_not_1(capsys, tmp_path):
    path = copy_of_goldens(tmp_path)
    flip_byte(path, EXPECTED, index=2)
    status, out, err = run(capsys, *TRANSPOSE, "-k", "2d_3x5", "--goldens", path)
    assert status == 2
    assert out == ""  # no case ran, none is reported failed
    assert err.startswith(f"error: damaged golden file {path}: dataset /{EXPECTED} does not match its sha256 checksum")
    assert "python generate_goldens.py" in err


def test_damage_in_another_op_still_refuses_the_file(capsys, tmp_path):
    path = copy_of_goldens(tmp_path)
    flip_byte(path, "softmax/yolov10_dfl_bf16/expected/input_grad")
    status, out, err = run(capsys, *TRANSPOSE, "--goldens", path)
    assert status == 2 and out == ""
    assert f"damaged golden file {path}: dataset /softmax/yolov10_dfl_bf16/expected/input_grad" in err


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "signature"])
def test_a_file_that_is_not_readable_hdf5_exits_2(capsys, tmp_path, how):
    path = copy_of_goldens(tmp_path)
    data = open(path, "rb").read()
    damaged = {"truncated": data[:len(data) // 2], "garbage": bytes(range(256)) * 64, "empty": b"",
               "signature": b"\0" * 8 + data[8:]}[how]
    with open(path, "wb") as file:
        file.write(damaged)
    status, out, err = run(capsys, *TRANSPOSE, "--goldens", path)
    assert status == 2 and out == ""
    assert err.startswith(f"error: damaged golden file {path}: not a readable HDF5 file (")
    assert "Traceback" not in err


def test_a_truncated_file_from_the_shell(tmp_path):
    """The real command: one line on stderr, no traceback, exit 2."""
    path = copy_of_goldens(tmp_path)
    os.truncate(path, os.path.getsize(path) - 100)
    done = subprocess.run([sys.executable, "-m", "conformance", *TRANSPOSE, "--goldens", path],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"error: damaged golden file {path}: not a readable HDF5 file (")
    assert "truncated" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1


def test_a_damaged_object_header_names_the_object(capsys, tmp_path):
    """Damage in HDF5's own metadata (here a dataset's object header) rather than in the values."""
    path = copy_of_goldens(tmp_path)
    with h5py.File(path, "r") as store:
        header = h5py.h5o.get_info(store[EXPECTED].id).addr
    with open(path, "r+b") as file:
        file.seek(header)
        file.write(b"\xff" * 16)
    status, out, err = run(capsys, *TRANSPOSE, "--goldens", path)
    assert status == 2 and out == ""
    assert err.startswith(f"error: damaged golden file {path}: /{EXPECTED} cannot be read (")
    assert "Traceback" not in err


@pytest.mark.parametrize("group", ["inputs", "expected"])
def test_a_case_without_a_group_exits_2(capsys, tmp_path, group):
    path = copy_of_goldens(tmp_path)
    with h5py.File(path, "r+") as store:
        del store[f"transpose/2d_3x5/{group}"]
    status, out, err = run(capsys, *TRANSPOSE, "--goldens", path)
    assert status == 2 and out == ""
    assert err.startswith(f"error: damaged golden file {path}: /transpose/2d_3x5 has no group {group}")


def test_a_missing_op_group_names_file_and_op(capsys, tmp_path):
    path = copy_of_goldens(tmp_path)
    with h5py.File(path, "r+") as store:
        del store["transpose"]
    status, out, err = run(capsys, *TRANSPOSE, "--goldens", path)
    assert status == 2 and out == ""
    assert err == f"error: {path} has no group transpose: regenerate it with `python generate_goldens.py`\n"


@pytest.mark.parametrize("edit, message", [
    (lambda store: store["transpose"].attrs.__setitem__("cases_digest", "0" * 64),
     "{path} is older than the case declarations of transpose (its cases_digest differs)"),
    (lambda store: store.attrs.__setitem__("schema_version", 1), f"{{path}} has schema 1, expected {SCHEMA_VERSION}"),
    (lambda store: store["transpose"].__delitem__("2d_3x5"), "{path} lacks 1 declared cases (transpose/2d_3x5)"),
])
def test_stale_goldens_name_the_file_given(capsys, tmp_path, edit, message):
    path = str(tmp_path / "elsewhere.h5")
    shutil.copyfile(DEFAULT_PATH, path)
    with h5py.File(path, "r+") as store:
        edit(store)
    status, out, err = run(capsys, *TRANSPOSE, "--goldens", path)
    assert status == 2 and out == ""
    assert err == f"error: {message.format(path=path)}: regenerate it with `python generate_goldens.py`\n"
    assert DEFAULT_PATH not in err
