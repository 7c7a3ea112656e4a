"""Every malformed schedule of test/inputs/schedules/bad gives its message,
names the file (and row:col where the catalogue says), exits 1 and writes no
output; usage errors exit 2."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from plan_cli import PLAN_TOOL, SCHEDULES, run_plan

BAD = SCHEDULES / "bad"


def catalogue() -> list[tuple[str, str, str, str]]:
    """(file, dialect, location, expected) rows of bad/README.md."""
    rows = []
    for line in (BAD / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].endswith((".csv", ".json")):
            continue
        file, dialect, _stage, location, expected = cells
        rows.append((file, dialect, location, expected.strip("`")))
    return rows


def test_catalogue_is_large_and_complete():
    listed = {row[0] for row in catalogue()}
    on_disk = {p.name for p in BAD.iterdir() if p.suffix in (".csv", ".json")}
    assert len(listed) >= 15
    assert listed == on_disk


@pytest.mark.parametrize("file,dialect,location,expected", catalogue())
def test_bad_schedule_is_rejected(tmp_path, file, dialect, location, expected):
    out = tmp_path / "plan.json"
    path = BAD / file
    proc = run_plan("--schedule", str(path), "--schedule-dialect", dialect,
                    "--emit", "json", "-o", str(out), check=False)
    assert proc.returncode == 1, proc.stderr
    assert expected in proc.stderr
    prefix = f"{path}:{location}:" if re.fullmatch(r"\d+:\d+", location) else str(path)
    assert prefix in proc.stderr
    assert list(tmp_path.iterdir()) == [], "no output (not even a temporary) on failure"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--prefetch", "soon"], "--prefetch: expected jit, lookahead=K or bubble, got 'soon'"),
        (["--checkpoint", "auto"], "--checkpoint auto needs --memory-budget"),
        (["--memory-budget", "lots"], "--memory-budget: expected bytes such as 24GiB"),
        (["--memory-budget", "8388608TiB"], "--memory-budget: expected bytes such as 24GiB"),
        (["--schedule", "a.csv", "--schedule-gen", "zbv"], "are exclusive"),
        (["--no-such-flag"], "Unknown command line argument"),
        (["--schedule-gen", "zbv", "--stages", "0:0-3"], "--stages shapes a model; give one with --model"),
    ],
)
def test_usage_errors_exit_2(args, message):
    proc = run_plan(*args, check=False)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_unsupported_generator_size_is_explained():
    proc = run_plan("--schedule-gen", "dualpipev", "--ranks", "4", "--microbatches", "3",
                    check=False)
    assert proc.returncode == 1
    assert "dualpipev" in proc.stderr.lower()


def test_missing_schedule_file_is_an_error(tmp_path):
    missing = tmp_path / "nope.csv"
    proc = run_plan("--schedule", str(missing), check=False)
    assert proc.returncode == 1
    assert str(missing) in proc.stderr


def test_json_number_out_of_range_is_a_located_error(tmp_path):
    path = tmp_path / "big.json"
    path.write_text('{"format": "hp-recompute-schedule", "version": 1, "ranks": '
                    '[{"rank": 0, "actions": [{"op": "forward", "stage": 0, "microbatch": 1e999}]}]}')
    proc = run_plan("--schedule", str(path), check=False)
    assert proc.returncode == 1
    assert f"{path}: invalid JSON:" in proc.stderr and "number overflow" in proc.stderr


def test_deeply_nested_json_is_refused_not_crashed(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"ranks": ' + "[" * 100000 + "]" * 100000 + "}")
    proc = run_plan("--schedule", str(path), check=False)
    assert proc.returncode == 1
    assert "nested deeper than 64 levels" in proc.stderr


def test_model_json_number_out_of_range_is_a_located_error(tmp_path):
    path = tmp_path / "model.json"
    path.write_text('{"format": "hp-recompute-model", "version": 1, "name": "m", '
                    '"regions": [{"name": "a", "fwd_flops": 1e400}]}')
    proc = run_plan("--model", str(path), "--schedule-gen", "1f1b", "--ranks", "1",
                    "--microbatches", "1", check=False)
    assert proc.returncode == 1
    assert f"{path}: invalid JSON:" in proc.stderr


def test_file_name_that_is_not_utf8_still_gives_valid_json(tmp_path):
    path = os.path.join(os.fsencode(tmp_path), b"s\xff.csv")
    with open(path, "w") as f:
        f.write("0F0,0I0,0W0\n")
    proc = subprocess.run([os.fsencode(PLAN_TOOL), b"--schedule", path, b"--emit", b"json"],
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["schedule"]["name"].startswith("s")


def test_adjacent_legacy_combined_cells_stay_apart(tmp_path):
    path = tmp_path / "combined.csv"
    path.write_text(
        "0F0,0F1,0SEND_F0_0SEND_F1,0RECV_B0_0RECV_B1,(0F2;0BW0)OVERLAP_F_B,0SEND_F2,0BW1,0RECV_B2,0BW2\n"
        "1RECV_F0,1F0,1BW0,1SEND_B0,1RECV_F1,1F1,1BW1,1SEND_B1,1RECV_F2,1F2,1BW2,1SEND_B2\n")
    out = run_plan("--schedule", str(path), "--schedule-dialect", "legacy", "--emit", "csv").stdout
    cells = out.splitlines()[0].split(",")
    assert "0SEND_F0_0SEND_F1" in cells and "0RECV_B0_0RECV_B1" in cells
    assert "(0F2;0BW0)OVERLAP_F_B" in cells


def test_generated_schedules_are_capped():
    proc = run_plan("--schedule-gen", "1f1b", "--ranks", "4096", "--microbatches", "100000",
                    check=False)
    assert proc.returncode == 1
    assert "compute actions; at most 30000000 are generated" in proc.stderr
