"""Reads a PyTorch state dict into NumPy arrays without PyTorch.

The ImageNet weights tfdml converts (`tfdml.models.efficientnet_lite`) ship as `.pth` files; reading them must
not pull in PyTorch, a large install, for a TensorFlow user. Two layouts exist:

- the zip layout (PyTorch >= 1.6): `<root>/data.pkl` (the pickled dict) and one `<root>/data/<key>` file
  of raw bytes per storage;
- the legacy layout (earlier writers): five pickles in a row (magic number, protocol, system info, the dict,
  the list of storage keys) followed, for each key in that order, by the storage's element count
  (little-endian int64) and its raw bytes.

In both the dict pickles tensors as `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`,
with each storage a persistent id `("storage", <dtype class>, key, location, numel)`. This module answers those
calls with NumPy arrays and refuses any other global, so loading a file runs no code from it.
"""

import collections
import io
import pickle
import zipfile

import numpy as np

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C

_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class StateDictError(ValueError):
    """A file that is not a PyTorch state dict this reader understands, or that is damaged."""


class _Storage:
    def __init__(self, dtype, numel):
        self.dtype = np.dtype(dtype)
        self.numel = int(numel)
        self.data = None  # a flat array, filled once the storage's bytes are read


class _Tensor:
    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, int(offset), tuple(size), tuple(stride)

    def array(self):
        flat = self.storage.data
        if flat is None:
            raise StateDictError("a tensor's storage was never read: the file is truncated")
        itemsize = flat.dtype.itemsize
        if not self.size:
            return flat[self.offset].copy()
        view = np.lib.stride_tricks.as_strided(
            flat[self.offset :], shape=self.size, strides=[s * itemsize for s in self.stride], writeable=False
        )
        return np.array(view)


def _rebuild_tensor(storage, offset, size, stride, *_):
    return _Tensor(storage, offset, size, stride)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file):
        super().__init__(file)
        self.storages = {}

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        raise StateDictError(f"unexpected object {module}.{name} in the state dict: only tensors are read")

    def persistent_load(self, saved_id):
        if not (isinstance(saved_id, tuple) and saved_id and saved_id[0] == "storage"):
            raise StateDictError(f"unexpected persistent id {saved_id!r} in the state dict")
        dtype, key, _location, numel = saved_id[1:5]
        if key not in self.storages:
            self.storages[key] = _Storage(dtype, numel)
        return self.storages[key]


def _arrays(state):
    if not isinstance(state, dict):
        raise StateDictError(f"the file holds a {type(state).__name__}, not a state dict")
    return collections.OrderedDict((name, tensor.array()) for name, tensor in state.items())


def _read_zip(path):
    with zipfile.ZipFile(path) as archive:
        pickles = [name for name in archive.namelist() if name.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise StateDictError(f"{path}: a zip without one data.pkl is not a PyTorch state dict")
        root = pickles[0][: -len("data.pkl")]
        unpickler = _Unpickler(io.BytesIO(archive.read(pickles[0])))
        state = unpickler.load()
        for key, storage in unpickler.storages.items():
            raw = archive.read(f"{root}data/{key}")
            storage.data = np.frombuffer(raw, storage.dtype, count=len(raw) // storage.dtype.itemsize)
    return _arrays(state)


def _read_legacy(path):
    with open(path, "rb") as file:
        try:
            magic = pickle.load(file)
        except Exception as error:
            raise StateDictError(f"{path}: not a PyTorch file ({type(error).__name__}: {error})") from error
        if magic != _LEGACY_MAGIC:
            raise StateDictError(f"{path}: not a PyTorch file (wrong magic number)")
        pickle.load(file)  # protocol version
        pickle.load(file)  # system info: byte order and type sizes, little-endian on every writer we meet
        unpickler = _Unpickler(file)
        state = unpickler.load()
        keys = pickle.load(file)
        for key in keys:
            storage = unpickler.storages[key]
            header = file.read(8)
            if len(header) < 8:
                raise StateDictError(f"{path}: truncated in storage {key!r}")
            numel = int.from_bytes(header, "little")
            raw = file.read(numel * storage.dtype.itemsize)
            if len(raw) < numel * storage.dtype.itemsize:
                raise StateDictError(f"{path}: truncated in storage {key!r}")
            storage.data = np.frombuffer(raw, storage.dtype)
    return _arrays(state)


def read_state_dict(path):
    """`{name: np.ndarray}` of a PyTorch state dict file (`torch.save(model.state_dict(), path)`), in order.

    Reads both the zip and the legacy layouts without importing PyTorch, and refuses a file that pickles
    anything but tensors and dicts (`StateDictError`).
    """
    path = str(path)
    try:
        is_zip = zipfile.is_zipfile(path)
    except OSError as error:
        raise StateDictError(f"{path}: cannot be read ({error})") from error
    try:
        return _read_zip(path) if is_zip else _read_legacy(path)
    except (pickle.UnpicklingError, EOFError, KeyError, zipfile.BadZipFile) as error:
        raise StateDictError(f"{path}: damaged PyTorch file ({type(error).__name__}: {error})") from error
