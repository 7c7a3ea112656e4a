"""Running a tool's command line, ``python -m MODULE ARGS``, in a process that starts with torch imported.

A fresh interpreter spends about 1.5 s of CPU importing torch before the tool reads its
first argument, and the suite runs a few hundred such commands (the runner's, the costs
tool's, the exporter's): a quarter of its CPU on a 2-core machine. ``run_module`` forks each
command from the multiprocessing fork server of the test process instead (the server that
starts the tests' ranks, ``hp_recompute.processes.rank_start_method``: it imported torch
once), and the command runs as ``python -m`` runs it (``runpy.run_module(MODULE,
run_name="__main__")``) in a process of its own: its own arguments, environment, working
directory, standard streams and exit status, what ``subprocess.run([sys.executable, "-m",
MODULE, *ARGS], capture_output=True, text=True)`` gives back. What differs from a fresh
interpreter: the modules the server imported (torch, and hp_recompute where the test
process had imported it) are imported already, and ``/proc/PID/environ`` shows the
server's environment. The command finds hp_recompute in this source tree, as the test
process does (its ``python/`` first on ``PYTHONPATH``, which the processes it starts inherit).
A test that needs a fresh interpreter (what an import does, a process found by its
environment) runs ``subprocess`` itself.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hp_recompute.processes import rank_start_method

PYTHON_DIR = str(Path(__file__).resolve().parents[2] / "python")
_REPLACED: List[Any] = []  # a command process's original standard streams (_command)


def run_module(module: str, args: Sequence[str], *, env: Optional[Dict[str, str]] = None,
               cwd: Optional[Path] = None, timeout: Optional[float] = 300,
               input: Optional[str] = None) -> subprocess.CompletedProcess:
    """``python -m module args`` (module docstring), in ``cwd`` (default this one's) with
    ``env`` (default this process's; ``PYTHON_DIR`` put first on its ``PYTHONPATH``) and
    ``input`` on its standard input (default none); raises ``subprocess.TimeoutExpired``
    after ``timeout`` seconds, the process killed."""
    argv = [sys.executable, "-m", module, *args]
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory(prefix="hpr-cli-") as tmp:
        streams = [Path(tmp) / name for name in ("stdin", "stdout", "stderr")]
        for stream, text in zip(streams, (input or "", "", "")):
            stream.write_text(text)
        process = multiprocessing.get_context(rank_start_method()).Process(
            target=_command, args=(module, list(args), env,
                                   str(cwd or os.getcwd()), [str(s) for s in streams]))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(argv, timeout, streams[1].read_text(), streams[2].read_text())
        return subprocess.CompletedProcess(argv, process.exitcode, streams[1].read_text(), streams[2].read_text())


def _command(module: str, args: Sequence[str], env: Dict[str, str], cwd: str, streams: Sequence[str]) -> None:
    """The forked process: the environment, directory and streams of the command, then the
    module as ``__main__``; exits with its status, as the interpreter would (a traceback and
    1 for an exception, a ``SystemExit`` message and 1 for a non-integer code)."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in enumerate(streams):
        opened = os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)
    # The streams they replace stay referenced: multiprocessing opened this process's stdin on
    # os.devnull, and its finalizer would close descriptor 0, now the command's.
    _REPLACED.extend((sys.stdin, sys.stdout, sys.stderr))
    sys.stdin, sys.stdout, sys.stderr = (open(fd, mode, closefd=False) for fd, mode in ((0, "r"), (1, "w"), (2, "w")))
    sys.argv = [module, *args]
    sys.path.insert(0, cwd)  # what -m puts first
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: B036 - the interpreter's own handling of an uncaught exception
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
