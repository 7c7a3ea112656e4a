"""Writing the files the command-line tools produce (reports, exports, measured costs).

Every Python tool (the runner's ``--report``, the exporter's outputs, ``costs -o``) writes
through this module, so they share one policy with ``hp-recompute-plan -o`` (docs/cli.md,
"Output files"):

NOTE [ Output files ]

1. ``-`` is stdout. An empty path is a usage error.
2. A path is followed through symlinks; a symlink loop is an error naming the path. The
   link itself is never replaced.
3. An existing directory is refused ("is a directory"), before any work.
4. An existing file that is not a regular file (a character device such as ``/dev/null`` or
   ``/dev/full``, a FIFO, a socket) is opened for writing as it is, without create,
   truncate or rename, and streamed into; a write error (ENOSPC on ``/dev/full``) is
   reported. It is never replaced by a regular file.
5. A regular file, or a new path, is written to a temporary file in the target's
   directory: flushed with every write checked, fsync'ed, then renamed over the target.
   An existing file keeps its permission bits, a new one gets ``0666 & ~umask``. On any
   failure (a full disk, EFBIG, an exception) the temporary is removed and the target is
   untouched. With several outputs, all are checked before any work, all are written
   first, and the temporaries are renamed only when every one succeeded.
6. An output that is also an input is refused before any work (a usage error), by file
   identity (``st_dev``, ``st_ino`` after symlinks), not by name; so are two outputs that
   are the same file.

Rules 1, 2, 3 and 6 are ``check_outputs`` (call it before the work); Rules 4 and 5 are
``write_outputs``. Both raise ``OutputError``, whose text names the tool's flag and path;
the tool adds its own prefix and exit status (``usage``: 2, else 1).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from typing import BinaryIO, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .errors import HPRecomputeError

__all__ = ["OutputError", "check_outputs", "write_outputs", "text_writer", "STDOUT"]

#: The path that means stdout (Rule 1).
STDOUT = "-"

#: Writes one output's bytes into the file object it is given.
Writer = Callable[[BinaryIO], None]
#: A file's identity (Rule 6): ``(st_dev, st_ino)``, or the resolved path of a file that does
#: not exist yet (two new outputs with one path are the same file too).
_Identity = Union[Tuple[int, int], str]


class OutputError(HPRecomputeError):
    """An output that breaks NOTE [ Output files ]; ``usage`` is True for Rules 1 and 6."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


def _stat(flag: str, path: str) -> Optional[os.stat_result]:
    """``os.stat`` through symlinks (Rule 2); None when nothing is there yet."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OutputError(f"{flag} {path}: a symlink loop (too many levels of symbolic links)") from None
        raise OutputError(f"{flag} {path}: {e.strerror}") from None


def _identity(st: Optional[os.stat_result], path: str) -> _Identity:
    return (st.st_dev, st.st_ino) if st is not None else os.path.realpath(path)


def check_outputs(outputs: Sequence[Tuple[str, str]], inputs: Sequence[Tuple[str, str]] = ()) -> None:
    """Refuses, before any work, outputs the command could not write or must not (Rules 1-3, 6).

    Args:
        outputs: ``(flag, path)`` of every output, e.g. ``("--report", "r.json")``.
        inputs: ``(flag, path)`` of every input file the command reads; inputs that do not
            exist are left to the reader's own error.
    Raises:
        OutputError: naming the flag and the path (``usage`` for Rules 1 and 6).
    """
    read: Dict[Tuple[int, int], str] = {}
    for flag, path in inputs:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(st.st_mode):  # a device or a pipe read and written loses nothing
            read.setdefault((st.st_dev, st.st_ino), f"{flag} {path}")
    written: Dict[_Identity, str] = {}
    for flag, path in outputs:
        if path == "":
            raise OutputError(f"{flag}: an empty path; give a file, or - for stdout", usage=True)
        if path == STDOUT:
            continue
        st = _stat(flag, path)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{flag} {path}: is a directory")
        if st is None or stat.S_ISREG(st.st_mode):
            folder = os.path.dirname(os.path.realpath(path))
            if not os.path.isdir(folder):
                raise OutputError(f"{flag} {path}: no directory {folder}")
            if not os.access(folder, os.W_OK):
                raise OutputError(f"{flag} {path}: the directory {folder} is not writable")
        key = _identity(st, path)
        if key in read:
            raise OutputError(f"{flag} {path} is the same file as the input {read[key]}; write the output "
                              f"elsewhere", usage=True)
        if key in written and (st is None or stat.S_ISREG(st.st_mode)):
            raise OutputError(f"{flag} {path} is the same file as {written[key]}", usage=True)
        written[key] = f"{flag} {path}"


def _remove(tmp: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


def _new_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _stream(flag: str, path: str, write: Writer) -> None:
    """Rules 1 and 4: into stdout or the special file as it is; every write error raised."""
    try:
        if path == STDOUT:
            sys.stdout.flush()  # what the tool printed before comes first
            with open(sys.stdout.fileno(), "wb", closefd=False) as f:
                write(f)
        else:
            # No O_CREAT, no O_TRUNC: a device stays the device (Rule 4).
            with open(os.open(path, os.O_WRONLY | os.O_CLOEXEC), "wb") as f:
                write(f)
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot write: {e.strerror or e}") from None


def _to_temporary(flag: str, path: str, write: Writer) -> Tuple[str, str]:
    """Rule 5's first half: ``write`` into a temporary beside the target; returns (temporary,
    target). On failure the temporary is gone and OutputError (or the writer's own error)
    is raised."""
    target = os.path.realpath(path)  # through symlinks: the link stays (Rule 2)
    try:
        mode = os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        mode = _new_file_mode()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                                   dir=os.path.dirname(target))
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot create a temporary file beside it: {e.strerror or e}") from None
    try:
        with open(fd, "wb") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
    except BaseException as e:
        _remove(tmp)
        if isinstance(e, OSError):
            raise OutputError(f"{flag} {path}: cannot write: {e.strerror or e}; {path} is unchanged") from None
        raise
    return tmp, target


def write_outputs(files: Sequence[Tuple[str, str, Writer]]) -> None:
    """Writes every ``(flag, path, write)`` as NOTE [ Output files ] Rules 4 and 5 say.

    ``write(f)`` gets a binary file object and writes the whole output into it. Special
    files and stdout are streamed in the order given; regular files are renamed over their
    targets only after every output was written.

    Raises:
        OutputError: naming the flag and the path of the output that failed; no regular
            target was touched then. An exception of a writer passes through unchanged
            (after the same clean-up).
    """
    done: List[Tuple[str, str]] = []
    try:
        for flag, path, write in files:
            st = None if path == STDOUT else _stat(flag, path)
            if path == STDOUT or (st is not None and not stat.S_ISREG(st.st_mode)):
                _stream(flag, path, write)
            else:
                done.append(_to_temporary(flag, path, write))
    except BaseException:
        for tmp, _ in done:
            _remove(tmp)
        raise
    for i, (tmp, target) in enumerate(done):
        try:
            os.replace(tmp, target)
        except OSError as e:
            for later, _ in done[i:]:
                _remove(later)
            raise OutputError(f"{target}: cannot rename the finished temporary file over it: "
                              f"{e.strerror or e}") from None


def text_writer(text: str) -> Writer:
    """A writer of ``text`` in UTF-8."""
    data = text.encode("utf-8")

    def write(f: BinaryIO) -> None:
        f.write(data)
    return write
