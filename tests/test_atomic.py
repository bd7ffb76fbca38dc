"""`atomic_path`'s temporary name, in the target's folder (a downloaded run's too): one no one
can foresee and that the write alone made, so that a link planted there is never written
through, two writes never share one, and the file ends with the permissions a plain open()
gives it. (A folder that cannot be written: test_errors.py.)"""

import os
import stat

import pytest
import torch

from bert_lightning.atomic import atomic_path, write_text


def test_a_link_planted_at_the_old_temporary_name_is_not_written_through(tmp_path):
    """The name the write used to take (`.<name>.tmp<pid><suffix>`), planted as a link to a
    file elsewhere: torch.save writes the checkpoint, not through the link."""
    target, elsewhere = tmp_path / "run" / "last.ckpt", tmp_path / "bashrc"
    elsewhere.write_text("mine\n")
    target.parent.mkdir()
    planted = target.with_name(f".{target.name}.tmp{os.getpid()}{target.suffix}")
    planted.symlink_to(elsewhere)
    with atomic_path(target) as tmp:
        torch.save({"step": 1}, tmp)
    assert elsewhere.read_bytes() == b"mine\n"
    assert not target.is_symlink() and torch.load(target, weights_only=True) == {"step": 1}


def test_two_writes_of_one_file_at_once_never_share_a_temporary_name(tmp_path):
    """Each a `.` name (an unfinished write to readers) keeping the suffix (some writers pick
    the format by it); the last to finish is the file, and nothing else is left."""
    target = tmp_path / "metrics.csv"
    with atomic_path(target) as first, atomic_path(target) as second:
        assert first != second
        assert all(t.name.startswith(".metrics.csv.") for t in (first, second))
        assert first.suffix == second.suffix == ".csv"
        first.write_text("first\n")
        second.write_text("second\n")
    assert target.read_text() == "first\n"  # the outer write finished last
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old\n")
    with pytest.raises(RuntimeError, match="mid-write"), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("mid-write")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_the_file_written_has_the_permissions_of_a_plain_open(tmp_path, umask):
    """0666 less the umask, as open() makes a file, not the 0600 of a temporary file."""
    old = os.umask(umask)
    try:
        write_text(tmp_path / "written.txt", "x")
        with open(tmp_path / "opened.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "written.txt").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "opened.txt").stat().st_mode) == 0o666 & ~umask
