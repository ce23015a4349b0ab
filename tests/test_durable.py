"""`tfdml.durable`'s writes from several processes at once: the workers of a multi-worker run each write the
same files (the configuration's snapshot); every write must land whole, none may fail on another's rename."""

import multiprocessing

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
