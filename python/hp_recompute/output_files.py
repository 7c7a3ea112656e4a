"""Writing the files the command-line tools produce (reports, exports, measured costs).

Two rules, the ones ``hp-recompute-plan -o`` follows too:

1. An output path is checked before the work that fills it, so a typo costs nothing.
2. A file is written to a temporary file beside its target and renamed over it when complete:
   a failure leaves the old file (or none). Through a symlink the target is replaced, not the
   link; an existing file keeps its permission bits, a new one gets the umask's (not
   ``mkstemp``'s 0600).
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable, List, Optional, Sequence, Tuple

__all__ = ["output_problem", "write_files"]


def output_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be written (Rule 1), or None."""
    target = os.path.realpath(path)
    folder = os.path.dirname(target)
    if os.path.isdir(target):
        return "is a directory"
    if not os.path.isdir(folder):
        return f"no directory {folder}"
    if not os.access(folder, os.W_OK):
        return f"{folder} is not writable"
    return None


def _mode_for(target: str) -> int:
    try:
        return os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_files(files: Sequence[Tuple[str, Callable[[str], None]]]) -> None:
    """Calls each ``write(temporary_path)`` and then renames every temporary over its path
    (Rule 2); on any failure no path is touched and no temporary is left. Raises OSError."""
    done: List[Tuple[str, str]] = []
    try:
        for path, write in files:
            target = os.path.realpath(path)
            fd, tmp = tempfile.mkstemp(prefix=".hpr-", suffix=os.path.splitext(target)[1],
                                       dir=os.path.dirname(target))
            os.close(fd)
            done.append((tmp, target))
            write(tmp)
            os.chmod(tmp, _mode_for(target))
    except BaseException:
        for tmp, _ in done:
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise
    for tmp, target in done:
        os.replace(tmp, target)


def write_text(path: str, text: str) -> None:
    """``write_files`` for one text file."""
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)
    write_files([(path, write)])
