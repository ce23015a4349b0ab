"""One writer per folder: an advisory lock file beside the folder a command writes.

`tfdml train` locks its report folder (and so its checkpoints), `tfdml export` the model folder it adds a
version to. The lock is `fcntl.flock` on `<parent>/.<folder name>.lock`: the kernel releases it when its
process ends, however it ends, so a lock left by a killed process is never mistaken for a live one. The file
records the holder (process id, start time, command) for the refusal message; a file left by a process that
is gone is taken over with a notice.

    with FolderLock("reports/glyphs_rll", "tfdml train", say=print):
        ...  # nobody else writes reports/glyphs_rll meanwhile

On platforms without `fcntl` (Windows) the lock is not taken.
"""

import datetime
import json
import os

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; the folder is written unguarded
    fcntl = None


class LockedError(RuntimeError):
    """The folder is locked by a live process; the message names it and how to proceed."""


def lock_path(folder):
    """`<parent>/.<name>.lock` for `folder` (beside it, so that it survives the folder being replaced)."""
    folder = os.path.abspath(os.fspath(folder))
    return os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}.lock")


def _holder_text(holder):
    if not holder:
        return "another process"
    return f"{holder.get('command', 'another process')} (pid {holder.get('pid')}, started {holder.get('started')})"


def _read_holder(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, 65536)
    try:
        return json.loads(data.decode()) if data else None
    except (ValueError, UnicodeDecodeError):
        return None


class FolderLock:
    """A context manager holding the lock of `folder` for `command` (a name for messages).

    `acquire` raises `LockedError` when a live process holds it (the message names that process and says
    `advice`); a lock file left by a process that is gone is taken over, said through `say`."""

    def __init__(self, folder, command, say=print, advice="wait for it to finish or stop it"):
        self.folder = os.fspath(folder)
        self.path = lock_path(folder)
        self.command = command
        self.say = say
        self.advice = advice
        self._fd = None

    def acquire(self):
        if fcntl is None or self._fd is not None:
            return self
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_holder(fd)
                os.close(fd)
                raise LockedError(f"{self.folder} is in use by {_holder_text(holder)}; {self.advice}") from None
            # The holder before us may have removed the file after we opened it: lock the file on disk.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = _read_holder(fd)
        if previous:  # released files are removed: this one was left by a process that died
            self.say(f"took over the lock of {self.folder} left by {_holder_text(previous)}, no longer running")
        record = {
            "pid": os.getpid(),
            "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "command": self.command,
        }
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(record).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self):
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # while still held: a waiting process then sees a fresh file
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
