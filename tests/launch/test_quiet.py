"""Where the quiet console's early C++ log goes: a folder only this user can enter."""

import os
import stat
import tempfile

from launch.cli import quiet


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_early_log_is_in_a_private_folder_of_this_user(tmp_path, monkeypatch):
    # Issue 18, item 12: a fixed name in the shared temp folder let another local user
    # pre-create the file (every launch then failed) or read its lines.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    os.chmod(tmp_path, 0o1777)  # Like /tmp.
    path = quiet.default_log_path("launch")
    folder = os.path.dirname(path)
    assert folder != str(tmp_path) and os.path.basename(path) == "launch.log"
    assert os.lstat(folder).st_uid == os.getuid() and _mode(folder) == 0o700
    assert quiet.default_log_path("launch") == path  # The same folder next time.


def test_a_shared_folder_at_the_private_name_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / f"replicator-{os.getuid()}"
    planted.mkdir()
    os.chmod(planted, 0o777)  # Anyone could write, replace or read files in it.
    path = quiet.default_log_path("evaluate")
    assert os.path.dirname(path) != str(planted)
    assert _mode(os.path.dirname(path)) == 0o700
