"""Every malformed schedule of test/inputs/schedules/bad gives its message,
names the file (and row:col where the catalogue says), exits 1 and writes no
output; usage errors exit 2."""

from __future__ import annotations

import re

import pytest

from plan_cli import SCHEDULES, run_plan

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
        (["--prefetch", "soon"], "--prefetch: expected jit or lookahead=K, got 'soon'"),
        (["--memory-budget", "lots"], "--memory-budget: expected bytes such as 24GiB"),
        (["--schedule", "a.csv", "--schedule-gen", "zbv"], "are exclusive"),
        (["--no-such-flag"], "Unknown command line argument"),
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
