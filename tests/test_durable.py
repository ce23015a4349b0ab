"""`tfdml.durable`'s writes from several processes at once: the workers of a multi-worker run each write the
same files (the configuration's snapshot); every write must land whole, none may fail on another's rename. The
staging folders of killed writers are removed by the next writer, a live writer's never."""

import multiprocessing
import os
import socket
import subprocess
import sys

from tfdml import durable


def _write_many(path, text, count):
    for _ in range(count):
        durable.write_text(path, text)


def test_processes_writing_one_file_at_once_each_land_a_whole_file(tmp_path):
    path = str(tmp_path / "snapshot.yaml")
    texts = ["a: 1\n" * 2000, "b: 2\n" * 3000]
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_write_many, args=(path, text, 40)) for text in texts]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert [writer.exitcode for writer in writers] == [0, 0]  # no FileNotFoundError from the other's rename
    with open(path) as f:
        assert f.read() in texts
    assert [p.name for p in tmp_path.iterdir()] == ["snapshot.yaml"]  # no temporary file left


def test_a_staging_folder_left_by_a_killed_writer_goes_and_a_live_ones_stays(tmp_path):
    """What a SIGKILLed `tfdml export` or `tfdml embed` leaves: its staging folder, named after its host and
    process id. The next writer removes it (that process is gone) but not the folder of a process still alive,
    nor one of another host (a shared file system), nor anything else in the folder."""
    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # exited: no process has this id now (ids are not reused this soon)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for name in (f".tmp-export-{host}-{dead_pid}-a1", f".tmp-export-{host}-{live.pid}-b2"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "saved_model.pb").write_bytes(b"half-written")
        for name in (f".tmp-export-elsewhere-{dead_pid}-c3", "1", f".tmp-embed-out-{host}-{dead_pid}-d4"):
            (tmp_path / name).mkdir()
        staging = durable.staging_folder(str(tmp_path), ".tmp-export-")
    finally:
        live.kill()
        live.wait()
    assert os.path.basename(staging).startswith(f".tmp-export-{host}-{os.getpid()}-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            "1",
            os.path.basename(staging),
            f".tmp-export-{host}-{live.pid}-b2",
            f".tmp-export-elsewhere-{dead_pid}-c3",
            f".tmp-embed-out-{host}-{dead_pid}-d4",
        ]
    )
