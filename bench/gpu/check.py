#!/usr/bin/env python3
"""The driver of bench/gpu/run.sh: runs each check as a subprocess, prints one table.

Checks, in order (README.md): the environment; test/python/test_device.py; the eager
suite with CUDA tensors (HPR_TEST_DEVICE=cuda); the eager bench on the device
(eager_device.py); a single-process runner step of the bundled GPT for each plan in
plans/ (``python -m hp_recompute.run --single-process --device ...``); the side-stream
prefetch overlap with its profiler trace (overlap.py). Each has a time limit and the
whole run a deadline (under 8 minutes); a check that fails or times out is a FAILED
row and the next one runs. ``--dry-run`` runs every check on the CPU at tiny sizes, the
CUDA-only tests skipping, so that the script cannot rot (CI runs it through
test/python/test_gpu_bench_dry_run.py).

Exit status: 0 when no row is FAILED, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from rows import add_row, fmt_bytes, read_rows, render  # noqa: E402

#: The whole run stays under this (a device session lends about 10 minutes).
DEADLINE_S = 450.0


class Runner:
    def __init__(self, args: argparse.Namespace, out: str) -> None:
        self.args, self.out = args, out
        self.rows_path = os.path.join(out, "rows.jsonl")
        if os.path.exists(self.rows_path):
            os.unlink(self.rows_path)
        self.started = time.monotonic()
        self.failed = False
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.path.join(REPO, "python") + (
            os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.env.setdefault("KINETO_LOG_LEVEL", "10")
        # cuBLAS is bit-reproducible across concurrent streams only with a configured workspace
        # (CUDA docs, "results reproducibility"); the device tests compare side-stream replays bit for bit.
        self.env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    def left(self) -> float:
        return DEADLINE_S - (time.monotonic() - self.started)

    def run(self, check: str, cmd: List[str], limit: float, env: Optional[Dict[str, str]] = None,
            row_on_failure: bool = True) -> Optional[subprocess.CompletedProcess]:
        """Runs ``cmd`` within ``limit`` seconds (and the deadline); a row is added when it
        times out, is skipped for lack of time, or (``row_on_failure``) exits non-zero
        without adding a row itself. Returns the process, or None."""
        before = len(read_rows(self.rows_path))
        limit = min(limit, self.left())
        if limit < 5:
            add_row(self.rows_path, check, "skipped: the run's deadline was reached", "")
            return None
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env or self.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=limit)
        except subprocess.TimeoutExpired as e:
            output = e.output if isinstance(e.output, str) else (e.output or b"").decode(errors="replace")
            self._log(check, output)
            add_row(self.rows_path, check, "FAILED", f"timed out after {limit:.0f} s")
            self._seconds(before, time.monotonic() - start)
            return None
        self._log(check, proc.stdout)
        if row_on_failure and proc.returncode != 0 and len(read_rows(self.rows_path)) == before:
            tail = " / ".join(line for line in proc.stdout.strip().splitlines()[-3:])
            add_row(self.rows_path, check, "FAILED", f"exit {proc.returncode}: {tail[-300:]}")
        self._seconds(before, time.monotonic() - start)
        return proc

    def _log(self, name: str, text: str) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")
        with open(os.path.join(self.out, f"log-{safe}.txt"), "w", encoding="utf-8") as f:
            f.write(text or "")
        if self.args.verbose:
            sys.stdout.write(text or "")

    def _seconds(self, before: int, seconds: float) -> None:
        """Puts the check's wall time on its first row."""
        rows = read_rows(self.rows_path)
        if len(rows) > before:
            rows[before]["seconds"] = seconds
            with open(self.rows_path, "w", encoding="utf-8") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")


def _pytest_row(runner: Runner, check: str, cmd: List[str], limit: float, env: Dict[str, str]) -> None:
    before = len(read_rows(runner.rows_path))
    start = time.monotonic()
    proc = runner.run(check, cmd, limit, env=env, row_on_failure=False)
    if proc is None:
        return
    lines = proc.stdout.strip().splitlines()
    counts = re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", lines[-1] if lines else "")
    summary = ", ".join(f"{n} {what}" for n, what in counts) or (lines[-1][-300:] if lines else "no output")
    failures = [line[len("FAILED "):] for line in lines if line.startswith("FAILED ")]
    if failures:
        summary += "; " + "; ".join(failures[:3])
    if proc.returncode == 0:
        status = "ok"
    elif "No module named pytest" in proc.stdout:
        status = "skipped: pytest is not installed for this python"
    else:
        status = "FAILED"
    add_row(runner.rows_path, check, status, summary)
    runner._seconds(before, time.monotonic() - start)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description="bench/gpu: the prepared device check (README.md)")
    p.add_argument("--dry-run", action="store_true", help="every check on the CPU at tiny sizes")
    p.add_argument("--device", default=None, help="default: cuda (cpu with --dry-run)")
    p.add_argument("--out", default=None, help="folder for the table, logs, reports and the trace")
    p.add_argument("--results", default=None, help="also write the table here (run.sh: bench/gpu/results-DATE.md)")
    p.add_argument("--verbose", action="store_true", help="print every check's output")
    args = p.parse_args(argv)
    dry = args.dry_run
    device = args.device or ("cpu" if dry else "cuda")
    out = os.path.abspath(args.out or os.path.join(HERE, "out"))
    os.makedirs(out, exist_ok=True)
    r = Runner(args, out)
    py = sys.executable
    date = datetime.date.today().isoformat()

    # 1. the environment
    start = time.monotonic()
    proc = r.run("environment", [py, "-c", (
        "import platform, torch\n"
        "acc = getattr(torch, 'accelerator', None)\n"
        "name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device'\n"
        "print(f'python {platform.python_version()}, torch {torch.__version__}, cuda {torch.version.cuda}, '\n"
        "      f'{name}, {torch.cuda.device_count()} device(s)')\n")], 60)
    if proc is not None and proc.returncode == 0:
        add_row(r.rows_path, "environment", "ok", proc.stdout.strip().splitlines()[-1] + (" (dry run)" if dry else ""))
        r._seconds(0, time.monotonic() - start)

    # 2. the tests that need a device
    _pytest_row(r, "test/python/test_device.py", [py, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
                                                   "test/python/test_device.py"], 120, r.env)
    if dry:
        add_row(r.rows_path, "eager suite with CUDA tensors (HPR_TEST_DEVICE=cuda)",
                "skipped: dry run (CI runs test/python/eager on the CPU)", "")
    else:
        env = dict(r.env, HPR_TEST_DEVICE=device)
        _pytest_row(r, f"eager suite with {device} tensors (HPR_TEST_DEVICE={device})",
                    [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "test/python/eager"], 150, env)

    # 3. the eager bench on the device
    sizes = (["--blocks", "2", "--microbatches", "2", "--dim", "16", "--hidden", "32", "--batch", "4", "--reps", "1"]
             if dry else ["--blocks", "8", "--microbatches", "4", "--dim", "1024", "--hidden", "4096",
                          "--batch", "2048", "--reps", "5"])
    r.run("eager bench", [py, os.path.join(HERE, "eager_device.py"), "--device", device, "--row-file", r.rows_path]
          + sizes, 90)

    # 4. the runner: the bundled GPT on ZBV, one plan per prefetch policy
    for plan in sorted(glob.glob(os.path.join(HERE, "plans", "*.json"))):
        name = os.path.splitext(os.path.basename(plan))[0]
        report = os.path.join(out, f"run-{name}.json")
        check = f"runner {name} (GPT, single process, {device})"
        before = len(read_rows(r.rows_path))
        start = time.monotonic()
        if os.path.exists(report):
            os.unlink(report)
        proc = r.run(check, [py, "-m", "hp_recompute.run", "--plan", plan, "--single-process", "--device", device,
                             "--steps", "1" if dry else "3", "--report", report, "--quiet"], 60, row_on_failure=False)
        if proc is None:
            continue
        try:
            with open(report, encoding="utf-8") as f:
                rep = json.load(f)
        except (OSError, ValueError) as e:
            tail = " / ".join(proc.stdout.strip().splitlines()[-3:])[-300:]
            add_row(r.rows_path, check, "FAILED", f"exit {proc.returncode}, no report ({e}): {tail}")
            r._seconds(before, time.monotonic() - start)
            continue
        details = (f"grads_match {str(rep.get('grads_match')).lower()} (max abs diff {rep.get('max_abs_diff')}), "
                   f"recomputes {rep.get('recomputes')}/{rep.get('recomputes_expected')}, sessions_left "
                   f"{rep.get('sessions_left')}, step {1e3 * rep.get('median_step_time_s', 0):.1f} ms, " + (
                       f"peak {fmt_bytes(rep.get('device_peak_bytes'))} at the {device} allocator"
                       if rep.get("device_peak_bytes") is not None else "peak not measured on the cpu"))
        if rep.get("error"):
            details = rep["error"]
        add_row(r.rows_path, check, "ok" if rep.get("ok") else "FAILED", details)
        r._seconds(before, time.monotonic() - start)

    # 5. a prefetch on a side stream overlapping other work, with its trace
    sizes = ["--dim", "32", "--blocks", "2", "--batch", "8", "--reps", "1"] if dry else [
        "--dim", "4096", "--blocks", "4", "--batch", "4096", "--reps", "5"]
    r.run("side-stream prefetch overlap", [py, os.path.join(HERE, "overlap.py"), "--device", device, "--out", out,
                                           "--row-file", r.rows_path] + sizes, 90)

    rows = read_rows(r.rows_path)
    failed = [row for row in rows if row["status"].startswith("FAILED")]
    total = time.monotonic() - r.started
    title = (f"# bench/gpu {'dry run' if dry else 'results'} {date}\n\n"
             f"`bash bench/gpu/run.sh{' --dry-run' if dry else ''}` on {device}, {total:.0f} s in all, "
             f"{len(failed)} failed; logs, reports and overlap-trace.json in {out}.\n\n")
    table = render(rows)
    print(table, end="")
    print(f"bench/gpu: {len(rows)} rows, {len(failed)} FAILED, {total:.0f} s")
    name = f"results-{'dry-run-' if dry else ''}{date}.md"
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
        f.write(title + table)
    if args.results:
        shutil.copyfile(os.path.join(out, name), args.results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
