"""bench/gpu/run.sh, the prepared device check, keeps working: its dry run on the CPU.

The script runs on a lent device only now and then; its ``--dry-run`` runs every check
on the CPU at tiny sizes with this test's interpreter (so CI covers it under both
torches). The trace reading of overlap.py, which a CPU trace (no kernels) never
exercises, is checked on a made-up trace.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BENCH = os.path.join(REPO, "bench", "gpu")
HEADER = "| check | status | details | seconds |"
CHECKS = ("environment", "test/python/test_device.py", "eager suite", "eager bench native", "eager bench ours-plain",
          "eager bench ours-session", "eager bench ours-side", "runner zbv-jit", "runner zbv-bubble",
          "side-stream prefetch overlap")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_dry_run_passes_and_prints_the_table(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    env.pop("OUT", None)
    proc = subprocess.run(["bash", os.path.join(BENCH, "run.sh"), "--dry-run", "--out", str(tmp_path)], cwd=REPO,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = proc.stdout.splitlines()
    assert HEADER in lines
    table = lines[lines.index(HEADER):]
    for check in CHECKS:
        rows = [line for line in table if line.startswith(f"| {check}")]
        assert rows, f"no row for {check!r} in:\n" + "\n".join(table)
        assert all("FAILED" not in row for row in rows), rows
    results = [n for n in os.listdir(tmp_path) if n.startswith("results-dry-run-") and n.endswith(".md")]
    assert len(results) == 1
    with open(tmp_path / results[0], encoding="utf-8") as f:
        assert HEADER in f.read().splitlines()
    with open(tmp_path / "overlap-trace.json", encoding="utf-8") as f:
        json.load(f)  # a trace the profiler wrote and overlap.py read back
    # a dry run writes nothing into the tree
    assert not [n for n in os.listdir(BENCH) if n.startswith("results-dry-run")]


def test_concurrent_kernel_time_of_a_trace():
    sys.path.insert(0, BENCH)
    try:
        from overlap import concurrent_kernel_us
    finally:
        sys.path.remove(BENCH)

    def kernel(stream, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur, "args": {"stream": stream}}

    trace = {"traceEvents": [
        kernel(7, 0, 100), kernel(7, 100, 50),  # main stream busy 0..150
        kernel(13, 120, 100),                   # side stream 120..220: 30 us together
        kernel(13, 300, 10), kernel(7, 305, 10),  # 5 us together
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 400},  # not a kernel
    ]}
    kernels, busy, overlap = concurrent_kernel_us(trace)
    assert kernels == 5
    assert busy == {7: 160.0, 13: 110.0}
    assert overlap == pytest.approx(35.0)
    assert concurrent_kernel_us(trace["traceEvents"][:2])[2] == 0.0  # torch 1.13 writes a bare list
