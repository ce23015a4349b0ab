"""Durable writes, one way for every writer: written beside its place, flushed to the disk (`fsync`), renamed
into place, the folder synced; records of sizes and sha256 checksums, and their check on reading.

A power cut after a rename can otherwise leave the renamed file empty or partial: the rename reaches the disk
before the data it names unless the data was synced first (PostgreSQL's and SQLite's discipline). A damaged
file is named by `check_files` (a `DamagedFileError`); a write that fails for lack of space, an I/O error or a
read-only file system becomes a `StorageError` whose message is one line naming the path and the free space.
A whole output (an export's version, an embed's folder) is written in a `staging_folder`, which also clears
the staging folders of writers killed before they finished.
"""

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile

# The write failures of the storage itself (not of the program): said in one line, the work kept.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)
_CHUNK = 1 << 20


class DamagedFileError(ValueError):
    """A file whose size or checksum differs from the one recorded when it was written."""


class StorageError(OSError):
    """A write that the storage refused (full, read-only, failing); the message is one line naming the path."""

    def __str__(self):
        return self.strerror


def _fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    except OSError as error:
        if not directory or error.errno not in (errno.EINVAL, errno.EBADF):  # folders some systems cannot sync
            raise
    finally:
        os.close(fd)


def sync_folder(path):
    """Flushes a folder's entries (renames, new files) to the disk."""
    _fsync_path(path, directory=True)


def sync_tree(root):
    """Flushes every file and folder under `root` (and `root` itself) to the disk, the files first."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                _fsync_path(path)
        sync_folder(folder)


def publish(written, target):
    """Renames the file or folder `written` to `target` once its data is on the disk, then syncs the folder
    that holds `target`: after a power cut `target` is the old one or the whole new one."""
    if os.path.isdir(written):
        sync_tree(written)
    else:
        _fsync_path(written)
    os.replace(written, target)
    sync_folder(os.path.dirname(os.path.abspath(target)))


def temporary_path(target):
    """A hidden name beside `target`, on the same file system, that keeps its ending (`x.weights.h5` ->
    `.tmp-<pid>-x.weights.h5`), for writers that read the kind of file from its name. The process id keeps
    writers of one file apart (the workers of a multi-worker run each write the configuration's snapshot):
    each renames a whole file of its own into place."""
    folder, name = os.path.split(os.path.abspath(target))
    return os.path.join(folder, f".tmp-{os.getpid()}-{name}")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def staging_folder(parent, prefix):
    """A fresh folder `<prefix><host>-<pid>-XXXX` in `parent` to write a whole output in before it is renamed
    into place. Those a killed process left there (same prefix, this host, a process id no longer alive) are
    removed first: never read, they would otherwise hold their disk space for good. A live writer's, or another
    host's on a shared file system, is left alone."""
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"
    stale = re.compile(re.escape(f"{prefix}{host}-") + r"(\d+)-")
    for name in os.listdir(parent):
        found = stale.match(name)
        if found and int(found[1]) != os.getpid() and not _alive(int(found[1])):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{host}-{os.getpid()}-", dir=parent)


@contextlib.contextmanager
def replacing(target):
    """`with replacing(path) as written:` write the file `written`; on success it replaces `path` durably
    (`publish`), on failure it is removed and `path` is left as it was."""
    written = temporary_path(target)
    try:
        yield written
        publish(written, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(written)
        raise


def write_text(path, text):
    """Writes `text` to `path` durably (whole or not at all)."""
    with replacing(path) as written, open(written, "w") as f:
        f.write(text)


def write_json(path, value, **dump_options):
    """Writes `value` as JSON to `path` durably."""
    write_text(path, json.dumps(value, **dump_options))


def file_record(path):
    """`{"size": bytes, "sha256": hex}` of a file, read in pieces (a large file is never held whole)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


def folder_records(root, leave_out=()):
    """`{relative path: file_record}` of every file under `root` but those named in `leave_out`."""
    records = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            if relative not in leave_out and not os.path.islink(path):
                records[relative] = file_record(path)
    return dict(sorted(records.items()))


def file_problem(path, record):
    """What is wrong with the file at `path` against its `record` (missing, its size, its checksum), or None."""
    if not os.path.isfile(path):
        return "is missing"
    size = os.path.getsize(path)
    if size != record["size"]:
        return f"holds {size} bytes, not the {record['size']} written (truncated or overwritten)"
    if file_record(path)["sha256"] != record["sha256"]:
        return "differs from its checksum (sha256) recorded when it was written: it is damaged"
    return None


def check_files(root, records):
    """Raises `DamagedFileError` naming the first file under `root` that fails its record."""
    for relative, record in records.items():
        path = os.path.join(root, relative)
        problem = file_problem(path, record)
        if problem:
            raise DamagedFileError(f"{path} {problem}")


def free_bytes(path):
    """Free space on the file system that holds `path` (its nearest existing folder), or None."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _size(count):
    return f"{count / 2**20:.1f} MiB"


def _storage_errno(error):
    """The storage's errno behind `error`: an `OSError`'s, or the one its message names (TensorFlow's file
    writers raise `ResourceExhaustedError: ... No space left on device`; NumPy's a short write, `N requested
    and M written`, which is what a full disk does to it)."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno
    text = str(error)
    for code in STORAGE_ERRNOS:
        if os.strerror(code) in text:
            return code
    if isinstance(error, OSError) and re.search(r"\d+ requested and \d+ written", text):
        return errno.ENOSPC
    return None


def storage_error(error, path, needed=None):
    """A `StorageError` for an error of a write to `path` that the storage refused, or None for another
    error: one line naming the path, what happened and, for a full disk, the free space and the space needed
    where it is known."""
    if isinstance(error, StorageError):
        return error
    code = _storage_errno(error)
    if code not in STORAGE_ERRNOS:
        return None
    if code in (errno.ENOSPC, errno.EDQUOT):
        free = free_bytes(path)
        what = "no space left on the device" if code == errno.ENOSPC else "disk quota exceeded"
        details = [f"{_size(free)} free" if free is not None else None]
        details = ", ".join(d for d in details + [f"about {_size(needed)} needed" if needed else None] if d)
        what += f" ({details})" if details else ""
    elif code == errno.EROFS:
        what = "the file system is read-only"
    else:
        what = "input/output error from the storage (a failing disk or a lost network mount)"
    return StorageError(code, f"cannot write {path}: {what}")


@contextlib.contextmanager
def storage_errors(path, needed=None):
    """Turns a storage failure of the writes inside the block into a `StorageError` naming `path`; with
    `needed` (bytes) known, a disk with less free space is refused before anything is written (h5py, refused
    in the middle of a file, prints a traceback of each object it cannot close when the process ends)."""
    free = free_bytes(path) if needed else None
    if free is not None and free < needed:
        raise storage_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), path, needed)
    try:
        yield
    except Exception as error:
        converted = storage_error(error, path, needed)
        if converted is None or converted is error:
            raise
        raise converted from None
