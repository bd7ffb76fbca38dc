"""Writing a file or a folder so that a crash (or a full disk) never leaves it half-written:
everything is written under a temporary name in the same folder, then renamed over the target
(`os.replace`, atomic on POSIX within one file system). The one helper behind every writer of
ours: checkpoints, tokenizers, token shards, tables, embeddings, plots, results, HF folders.

It sits at the bottom of the package (standard library and `errors` only), so that the data
layer's writers use it too; `bert_lightning.checkpoint` re-exports it. A folder the user cannot
write to (or a full disk) is a one-line error naming the target."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bert_lightning.errors import UserError

# a folder the user cannot write to, a full disk or quota, a read-only file system
USER_FIXES = {errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.EROFS}


def unwritable(path: Path, e: OSError) -> UserError:
    """The target named, not our temporary sibling of it."""
    return UserError(f"{path}: cannot write it ({e.strerror})")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _temporary(path: Path, folder: bool) -> Path:
    """A new sibling of `path` that no one can foresee and that we alone made (O_EXCL: a
    link planted in the folder, a downloaded run's, is never written through). A `.` name:
    readers skip it as a write not finished (`checkpoint.newest_intact`)."""
    name = {"prefix": f".{path.name}.", "dir": path.parent}
    if folder:
        return Path(tempfile.mkdtemp(suffix=".tmp", **name))
    fd, tmp = tempfile.mkstemp(suffix=f".tmp{path.suffix}", **name)
    os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes it 0600: as open() would make it
    os.close(fd)
    return Path(tmp)


def current_umask() -> int:
    """The process umask (os.umask can only be read by setting it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(
    path: str | os.PathLike, folder: bool = False, replace: bool = True
) -> Iterator[Path]:
    """Yields a temporary sibling of `path` to write (a file name keeping `path`'s suffix, since
    some writers pick the format by it; or, with `folder=True`, an empty folder); on a clean
    exit renames it to `path`, on an exception removes it. A folder that exists is replaced
    only once the new one is whole; `replace=False` keeps an existing `path` (written meanwhile
    by another process) and drops ours."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temporary(path, folder)
    except OSError as e:
        raise unwritable(path, e) from e
    try:
        yield tmp
        if folder:  # mkdtemp makes the folder 0700 (and some writers 0600 files): the umask
            umask = current_umask()  # decides, as for anything else the user writes
            os.chmod(tmp, 0o777 & ~umask)
            for f in tmp.rglob("*"):
                os.chmod(f, (0o777 if f.is_dir() else 0o666) & ~umask)
        if path.exists() and not replace:
            _remove(tmp)
        elif folder and path.exists():
            old = path.with_name(f".{path.name}.old{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    except OSError as e:
        if not replace and path.exists():  # lost a race to another writer: theirs stays
            _remove(tmp)
            return
        _remove(tmp)
        if e.errno in USER_FIXES:
            raise unwritable(path, e) from e
        raise
    except BaseException:
        _remove(tmp)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(obj, path: str | os.PathLike) -> None:
    write_text(path, json.dumps(obj, indent=2) + "\n")
