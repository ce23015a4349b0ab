"""A file-system shim for fault injection, in-process (not a test module): the disk fills up, or fails, after a
chosen number of bytes of tfdml's durable writes.

Every file tfdml writes reaches its place through `tfdml.durable` (`publish`, `sync_tree`): the shim counts the
bytes of each file there, once, and when the budget is spent it cuts the file being written to what the disk
took and raises `OSError(code)` from it, as a full disk (`ENOSPC`), a failing one (`EIO`) or a file system
remounted read-only (`EROFS`) would. No mount, no root: it runs wherever the tests run.
"""

import errno
import json
import os

from tests.cli_process import small_job
from tfdml import durable
from tfdml.callbacks import checkpoint as checkpoint_lib

CODES = (errno.ENOSPC, errno.EIO, errno.EROFS)
KIND = {errno.ENOSPC: "no space left", errno.EIO: "input/output error", errno.EROFS: "read-only"}

# The default job cut to 4 epochs of 3 steps (`cli_process.small_job`), into `r` (the last argument).
JOB = small_job(4, 3)


def damage(path, rng, flip=None):
    """Damages the file at `path` at a drawn byte: one bit flipped there, or the file cut off there (`flip`; None:
    drawn, even odds). Returns `(byte, flip)`."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    place = int(rng.integers(len(data)))
    if flip is None:
        flip = bool(rng.random() < 0.5)
    if flip:
        data[place] ^= 1 << int(rng.integers(8))
    else:
        del data[place:]
    with open(path, "wb") as f:
        f.write(data)
    return place, flip


def results(report_dir):
    """`(retrieval figures, training history)` of a finished run's report: what a resumed run must repeat."""
    with open(os.path.join(report_dir, "metrics.json")) as f:
        metrics = json.load(f)
    return metrics["model"], metrics["history"]


def kept_checkpoints_problem(checkpoints):
    """What is wrong with what a failed run left in `checkpoints` (a listed file that fails its record), or
    None: nothing half-written is ever listed, so nothing half-written is ever loaded."""
    path = os.path.join(checkpoints, checkpoint_lib.METADATA_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        manifest = json.load(f)
    for entry in manifest["checkpoints"] + ([manifest["trained"]] if "trained" in manifest else []):
        problem = durable.file_problem(os.path.join(checkpoints, entry["file"]), entry)
        if problem:
            return f"{entry['file']} {problem}"
    return None


class DiskShim:
    """`DiskShim(budget, code).install(monkeypatch)`: durable writes fail with `code` after `budget` bytes;
    `written` counts the bytes every write passed (with `budget=None` nothing fails: a run measured)."""

    def __init__(self, budget=None, code=errno.ENOSPC):
        self.budget, self.code, self.written, self.failed = budget, code, 0, None
        self._seen = set()

    def _take(self, path):
        """Counts the file at `path` once (by name and size); fails when the budget does not hold it."""
        key = (os.path.abspath(path), os.path.getsize(path))
        if key in self._seen:
            return
        self._seen.add(key)
        size = key[1]
        if self.budget is not None and self.written + size > self.budget:  # and every write after it
            with open(path, "r+b") as f:
                f.truncate(max(0, self.budget - self.written))  # what the disk took before it failed
            self.failed = self.failed or path
            raise OSError(self.code, os.strerror(self.code), path)
        self.written += size

    def _take_tree(self, root):
        for folder, _, names in os.walk(root):
            for name in sorted(names):
                path = os.path.join(folder, name)
                if not os.path.islink(path):
                    self._take(path)

    def install(self, monkeypatch):
        publish, sync_tree = durable.publish, durable.sync_tree

        def counted_publish(written, target):
            self._take_tree(written) if os.path.isdir(written) else self._take(written)
            publish(written, target)

        def counted_sync_tree(root):
            self._take_tree(root)
            sync_tree(root)

        monkeypatch.setattr(durable, "publish", counted_publish)
        monkeypatch.setattr(durable, "sync_tree", counted_sync_tree)
        return self
