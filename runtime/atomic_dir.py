"""Writing a saved model's directory atomically.

The model is written into a fresh staging directory next to the target,
fsynced, and swapped in by renames: an interrupted save leaves the previous
model loadable, and a directory holding files that are not the model's is
never replaced.
"""

import os
import shutil
import tempfile
import uuid


def write_atomically(dirname, texts, write_binary):
    """Make `dirname` hold the files `texts` (name -> text) and the binary
    files `write_binary` (name -> function writing that file at a path), all
    at once or not at all; a directory that holds other files is refused."""
    target = os.path.abspath(dirname)
    parent, base = os.path.split(target)
    _check_replaceable(target, set(texts) | set(write_binary))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{base}.saving-", dir=parent)
    try:
        for name, text in texts.items():
            with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        for name, write in write_binary.items():
            path = os.path.join(staging, name)
            write(path)
            _fsync_path(path)
        _fsync_path(staging)
        _swap_in(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _fsync_path(parent)


def _check_replaceable(target, names):
    if not os.path.lexists(target):
        return
    if not os.path.isdir(target) or os.path.islink(target):
        raise FileExistsError(f"{target} exists and is not a directory; choose another path for the model")
    others = sorted(set(os.listdir(target)) - names)
    if others:
        # Saving replaces the whole directory; never delete the user's files.
        raise FileExistsError(f"{target} contains files that are not part of a saved model ({', '.join(others[:5])}); "
                              "save into an empty or new directory")


def _swap_in(staging, target):
    """Move `staging` to `target`, replacing a previous model: the old one is
    renamed aside first and restored if the second rename fails."""
    if not os.path.exists(target):
        os.rename(staging, target)
        return
    parent, base = os.path.split(target)
    aside = os.path.join(parent, f".{base}.old-{uuid.uuid4().hex[:8]}")
    os.rename(target, aside)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
