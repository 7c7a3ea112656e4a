"""NOTE [ Output files ] (output_files.py), the policy every Python tool writes by.

Device nodes are made with ``os.mknod`` in the test's folder (never the real /dev/null);
a full disk is ``RLIMIT_FSIZE`` in a child process (SIGXFSZ ignored, so a write past the
limit fails with EFBIG as it would with ENOSPC).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hpr_run_util import PYTHON_DIR, device_node
from hp_recompute.output_files import OutputError, check_outputs, text_writer, write_outputs


def test_a_character_device_is_streamed_into_not_replaced(tmp_path: Path) -> None:
    null = device_node(tmp_path, "null", 3)
    write_outputs([("-o", str(null), text_writer("x" * 100_000))])
    assert stat.S_ISCHR(null.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"], "no temporary beside it"


def test_a_full_device_reports_enospc_and_leaves_the_other_outputs_untouched(tmp_path: Path) -> None:
    full = device_node(tmp_path, "full", 7)
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    with pytest.raises(OutputError, match=f"^--b {full}: cannot write: No space left on device$"):
        write_outputs([("--a", str(kept), text_writer("new")), ("--b", str(full), text_writer("data"))])
    assert kept.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "kept.json"], "no temporary left"


def test_a_fifo_is_streamed_into(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_outputs([("-o", str(fifo), text_writer("through the pipe"))])
    reader.join(10)
    assert got == ["through the pipe"] and stat.S_ISFIFO(fifo.stat().st_mode)


FULL_DISK = """
import resource, signal, sys
sys.path.insert(0, sys.argv[1])
from hp_recompute.output_files import OutputError, text_writer, write_outputs
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    write_outputs([("-o", sys.argv[2], text_writer("y" * 100_000))])
except OutputError as e:
    print(e)
    sys.exit(1)
"""


def test_a_full_disk_leaves_the_old_file_byte_identical_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    old = b'{"old": true}\n' * 10
    target.write_bytes(old)
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(PYTHON_DIR), str(target)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.strip() == f"-o {target}: cannot write: File too large; {target} is unchanged"
    assert target.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_symlink_loop_is_refused_and_the_link_kept(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")
    with pytest.raises(OutputError, match=f"^-o {loop}: a symlink loop") as info:
        check_outputs([("-o", str(loop))])
    assert not info.value.usage
    with pytest.raises(OutputError, match="a symlink loop"):
        write_outputs([("-o", str(loop), text_writer("x"))])
    assert os.readlink(loop) == str(tmp_path / "loop")


def test_an_empty_path_is_a_usage_error() -> None:
    with pytest.raises(OutputError, match="^--report: an empty path; give a file, or - for stdout$") as info:
        check_outputs([("--report", "")])
    assert info.value.usage


def test_an_output_that_is_an_input_is_refused_by_identity(tmp_path: Path) -> None:
    """A hard link and a symlink name the input by another path: refused all the same."""
    plan = tmp_path / "p.json"
    plan.write_text("{}")
    hard = tmp_path / "hard.json"
    os.link(plan, hard)
    soft = tmp_path / "soft.json"
    soft.symlink_to(plan)
    for out in (plan, hard, soft):
        with pytest.raises(OutputError, match=f"^-o {out} is the same file as the input --plan {plan}; ") as info:
            check_outputs([("-o", str(out))], [("--plan", str(plan))])
        assert info.value.usage
    with pytest.raises(OutputError, match=f"^--b {soft} is the same file as --a {plan}$"):
        check_outputs([("--a", str(plan)), ("--b", str(soft))])
    check_outputs([("-o", str(tmp_path / "new.json"))], [("--plan", str(plan))])  # another file is fine


def test_a_new_file_gets_the_umask_mode(tmp_path: Path) -> None:
    umask = os.umask(0o027)
    try:
        write_outputs([("-o", str(tmp_path / "new.json"), text_writer("{}"))])
    finally:
        os.umask(umask)
    assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o640
