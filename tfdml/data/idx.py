"""IDX files (the MNIST family's format: Fashion-MNIST, KMNIST, EMNIST), plain or gzip-compressed.

Layout: two zero bytes, a type code (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E
float64), the number of dimensions, each dimension as a big-endian uint32, then the values, big-endian, in C
order.
"""

import gzip

import numpy as np

_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path):
    """The array an IDX file holds (`.gz` read through gzip), in native byte order; a `ValueError` naming the
    file when its header or its length is not that of an IDX file."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _TYPES:
        raise ValueError(f"{path}: not an IDX file (header {data[:4].hex() or 'empty'}).")
    dtype, ndim = np.dtype(_TYPES[data[2]]), data[3]
    header = 4 + 4 * ndim
    shape = tuple(int(n) for n in np.frombuffer(data[4:header], ">u4")) if ndim else ()
    expected = header + dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if len(data) != expected:
        raise ValueError(
            f"{path}: an IDX file of shape {shape} {dtype.name} has {expected} bytes, this one {len(data)}."
        )
    return np.frombuffer(data, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))
