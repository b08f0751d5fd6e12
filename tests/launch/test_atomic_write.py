"""`launch.runtime.run_dir.write_atomic`: the launcher's one way to replace a small file."""

import os

import pytest

from launch.runtime import run_dir


def test_a_write_that_fails_midway_leaves_the_old_file_whole_and_no_temporary(
    tmp_path, monkeypatch
):
    path = tmp_path / "launch.json"
    run_dir.write_json_atomic(str(path), {"steps": 1})
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    run_dir.write_json_atomic(str(path), {"steps": 2})
    assert path.read_text() == '{\n  "steps": 2\n}\n'
    assert len(synced) == 2  # The file's data, then the folder's entry.

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        run_dir.write_json_atomic(str(path), {"steps": 3})
    assert path.read_text() == '{\n  "steps": 2\n}\n'
    assert sorted(os.listdir(tmp_path)) == ["launch.json"]
