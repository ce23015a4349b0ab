"""`tfdml.data.idx.read_idx` on IDX files written here byte by byte from the format's description (header,
big-endian dimensions and values), plain and gzip-compressed; truncated and foreign files are refused."""

import gzip
import struct

import numpy as np
import pytest

from tfdml.data.idx import read_idx


def _write(path, array, code, compress=False):
    header = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", n) for n in array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    with (gzip.open if compress else open)(path, "wb") as f:
        f.write(payload)
    return payload


@pytest.mark.parametrize("compress", [False, True])
def test_images_and_labels_read_back(tmp_path, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 4, 3), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5], np.uint8)
    suffix = ".gz" if compress else ""
    _write(tmp_path / f"images-idx3-ubyte{suffix}", images, 0x08, compress)
    _write(tmp_path / f"labels-idx1-ubyte{suffix}", labels, 0x08, compress)
    np.testing.assert_array_equal(read_idx(str(tmp_path / f"images-idx3-ubyte{suffix}")), images)
    np.testing.assert_array_equal(read_idx(str(tmp_path / f"labels-idx1-ubyte{suffix}")), labels)


def test_big_endian_wide_types(tmp_path):
    values = np.array([[1.5, -2.25], [1e30, 0.0]], np.float32)
    payload = _write(tmp_path / "f.idx", values, 0x0D)
    assert payload[4:8] == b"\x00\x00\x00\x02" and payload[12:16] == struct.pack(">f", 1.5)
    read = read_idx(str(tmp_path / "f.idx"))
    assert read.dtype == np.float32 and read.dtype.isnative
    np.testing.assert_array_equal(read, values)
    ints = np.array([70000, -3], np.int32)
    _write(tmp_path / "i.idx", ints, 0x0C)
    np.testing.assert_array_equal(read_idx(str(tmp_path / "i.idx")), ints)


def test_bad_files_are_refused_with_their_name(tmp_path):
    (tmp_path / "text.idx").write_bytes(b"hello world")
    with pytest.raises(ValueError, match=r"text\.idx: not an IDX file"):
        read_idx(str(tmp_path / "text.idx"))
    payload = _write(tmp_path / "full.idx", np.zeros((4, 2), np.uint8), 0x08)
    (tmp_path / "cut.idx").write_bytes(payload[:-3])
    with pytest.raises(ValueError, match=r"cut\.idx: an IDX file of shape \(4, 2\) uint8 has 20 bytes, this one 17"):
        read_idx(str(tmp_path / "cut.idx"))
