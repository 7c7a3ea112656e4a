"""Writing the files the command-line tools produce (reports, exports, measured costs).

Every Python tool (the runner's ``--report``, the exporter's outputs, ``costs -o``) writes
through this module, so they share one policy with ``hp-recompute-plan -o`` (docs/cli.md,
"Output files").

NOTE [ Output files ]
=====================
This module implements the rules below; docs/rules.md states each one and why:

  hpr.output.stdout-dash       ``-`` is stdout, an empty path a usage error
  hpr.output.follow-symlinks   a link is followed and never replaced
  hpr.output.no-directory      a directory is refused before any work
  hpr.output.special-files     a device, FIFO or socket is streamed into as it is
  hpr.output.atomic-replace    a temporary beside the target, renamed once every output is written
  hpr.output.not-an-input      an output that is an input, or another output, is refused

``check_outputs`` (call it before the work) applies stdout-dash, follow-symlinks,
no-directory and not-an-input; ``write_outputs`` the rest. Both raise ``OutputError``, whose
text names the tool's flag and path; the tool adds its own prefix and exit status
(``usage``: 2, else 1).
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

#: The path that means stdout (hpr.output.stdout-dash).
STDOUT = "-"

#: Writes one output's bytes into the file object it is given.
Writer = Callable[[BinaryIO], None]
#: A file's identity (hpr.output.not-an-input): ``(st_dev, st_ino)``, or the resolved path of a
#: file that does not exist yet (two new outputs with one path are the same file too).
_Identity = Union[Tuple[int, int], str]


class OutputError(HPRecomputeError):
    """An output that breaks NOTE [ Output files ]; ``usage`` is True for hpr.output.stdout-dash and
    hpr.output.not-an-input."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


def _stat(flag: str, path: str) -> Optional[os.stat_result]:
    """``os.stat`` through symlinks (hpr.output.follow-symlinks); None when nothing is there yet."""
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
    """Refuses, before any work, outputs the command could not write or must not (hpr.output.stdout-dash,
    hpr.output.follow-symlinks, hpr.output.no-directory, hpr.output.not-an-input).

    Args:
        outputs: ``(flag, path)`` of every output, e.g. ``("--report", "r.json")``.
        inputs: ``(flag, path)`` of every input file the command reads; inputs that do not
            exist are left to the reader's own error.
    Raises:
        OutputError: naming the flag and the path (``usage`` for hpr.output.stdout-dash and
            hpr.output.not-an-input).
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
    """Into stdout or the special file as it is; every write error raised (hpr.output.stdout-dash,
    hpr.output.special-files)."""
    try:
        if path == STDOUT:
            sys.stdout.flush()  # what the tool printed before comes first
            with open(sys.stdout.fileno(), "wb", closefd=False) as f:
                write(f)
        else:
            # No O_CREAT, no O_TRUNC: a device stays the device (hpr.output.special-files).
            with open(os.open(path, os.O_WRONLY | os.O_CLOEXEC), "wb") as f:
                write(f)
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot write: {e.strerror or e}") from None


def _to_temporary(flag: str, path: str, write: Writer) -> Tuple[str, str]:
    """The first half of hpr.output.atomic-replace: ``write`` into a temporary beside the
    target; returns (temporary, target). On failure the temporary is gone and OutputError (or
    the writer's own error) is raised."""
    target = os.path.realpath(path)  # through symlinks: the link stays (hpr.output.follow-symlinks)
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
    """Writes every ``(flag, path, write)`` as hpr.output.special-files and hpr.output.atomic-replace say.

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
