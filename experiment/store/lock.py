"""The run directory's lock: an OS lock on an open file (flock), which the kernel drops when its
process dies, so a killed run leaves no stale lock; Linux's NFS client maps flock onto NFS
byte-range locks, so it also holds across hosts on a shared filesystem. Where a filesystem refuses
locks, a lock file created with O_EXCL stands in (its holder's host and pid are checked to recover
it after a crash)."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pathlib
import socket
import time
from typing import Callable, Iterator

from experiment.config import ConfigError


class WorkdirBusy(ConfigError):
    """Another process holds the run directory's lock; the message names it."""


def _holder(purpose: str) -> str:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "purpose": purpose,
                       "since": time.strftime("%Y-%m-%d %H:%M:%S")})


def _describe(text: str) -> str:
    try:
        h = json.loads(text)
        return f"{h['purpose']} (pid {h['pid']} on {h['host']}, since {h['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process"


class NotWritable(ConfigError):
    """The run directory cannot be written (read-only, no permission) or its lock file is not one."""


def _open(lock_path: pathlib.Path, unwritable: str | None = None) -> int:
    """The lock file, opened for writing; NotWritable, naming the folder or the file, otherwise
    (`unwritable`: what to do where the folder cannot be written; default: a run folder's fix)."""
    try:
        return os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) or not os.path.lexists(lock_path):
            fix = unwritable or (f"training and evaluation write their files and a lock there; copy the run somewhere "
                                 f"writable (cp -r {lock_path.parent} NEW) and use --workdir NEW")
            raise NotWritable(f"cannot write in {lock_path.parent} ({e.strerror}): {fix}") from None
        raise NotWritable(f"{lock_path} cannot be opened as the run directory's lock file ({e.strerror}); no "
                          f"process holds a lock there, so remove it: rm -r {lock_path}") from None


@contextlib.contextmanager
def holding(folder: pathlib.Path, purpose: str) -> Iterator[None]:
    """The folder, created if needed, held for `purpose` by its lock file `folder/.lock`. Work that
    stops before writing anything there (a bad data path, a bad option) leaves no trace: the lock
    file goes, and so do the folders created here, while they are empty."""
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NotWritable(f"cannot create {folder} ({e.strerror}); give a --workdir in a folder you can "
                          f"write") from None
    lock_path = folder / ".lock"
    release = acquire(lock_path, purpose)
    try:
        yield
    finally:
        try:
            unused = [p.name for p in folder.iterdir()] == [lock_path.name]
        except OSError:  # the folder went away or cannot be listed: leave it to the work's own error
            unused = False
        if unused:  # removed while held: a process that opened the old file finds it busy
            lock_path.unlink(missing_ok=True)
        release()
        for created_folder in created if unused else ():
            try:
                created_folder.rmdir()
            except OSError:
                break


def acquire(lock_path: pathlib.Path, purpose: str, *, name: str | None = None,
            instead: str = "or use another --workdir", unwritable: str | None = None) -> Callable[[], None]:
    """Take the lock; returns the function that releases it. A busy lock is a WorkdirBusy naming
    `name` (default: the lock's folder) and its holder, and saying `instead`; a folder that cannot be
    written a NotWritable saying `unwritable` (default: a run folder's fix)."""
    fd = _open(lock_path, unwritable)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            holder = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            raise WorkdirBusy(f"{name or lock_path.parent} is in use by {_describe(holder)}; wait for it to "
                              f"finish, {instead}") from None
        os.close(fd)
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            return _acquire_by_file(lock_path, purpose, name or str(lock_path.parent))
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, _holder(purpose).encode(), 0)

    def release():
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    return release


def _acquire_by_file(lock_path: pathlib.Path, purpose: str, name: str):
    """For filesystems without locks: an O_EXCL file naming its holder, recovered when that holder
    (on this host) is no longer alive."""
    path = lock_path.with_name(lock_path.name + ".owner")  # .lock.owner beside a run folder's .lock
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            text = path.read_text(errors="replace")
            try:
                holder = json.loads(text)
                stale = holder["host"] == socket.gethostname() and not _alive(int(holder["pid"]))
            except (ValueError, KeyError, TypeError):
                stale = False
            if stale:
                path.unlink(missing_ok=True)
                continue
            raise WorkdirBusy(f"{name} is in use by {_describe(text)}; wait for it to finish, "
                              f"or delete {path} if that process is gone") from None
        os.write(fd, _holder(purpose).encode())
        os.close(fd)
        return lambda: path.unlink(missing_ok=True)
    raise WorkdirBusy(f"could not take {path}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
