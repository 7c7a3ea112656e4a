"""Every malformed schedule of test/inputs/schedules/bad gives its message,
names the file (and row:col where the catalogue says), exits 1 and writes no
output; usage errors exit 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from pathlib import Path

import pytest

from plan_cli import PLAN_TOOL, REPO, SCHEDULES, run_plan

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
    spelling = ["--schedule-dialect", dialect] if path.suffix == ".csv" else []
    proc = run_plan("--schedule", str(path), *spelling, "--emit", "json", "-o", str(out), check=False)
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
        (["--emit", "json", "--emit", "summary"], "--emit is given 2 times; give it once"),
        (["-o", "a.json", "-o", "b.json"], "-o is given 2 times; give it once"),
        (["--schedule", str(SCHEDULES / "pytorch-zbv-5x11.csv"), "--ranks", "2"],
         "--ranks sizes a generated schedule; --schedule"),
        (["--schedule-gen", "1f1b", "--schedule-dialect", "legacy"], "--schedule-dialect spells CSV schedules"),
        (["--model", "examples/gpt/gpt.model.json", "--schedule-gen", "1f1b", "--profile"],
         "--profile applies to TorchScript models"),
        (["--model", "examples/gpt/gpt.model.json", "--schedule-gen", "1f1b", "--input-shape", "4x40"],
         "--input-shape applies to TorchScript models"),
        (["--memory-budget", "lots"], "--memory-budget: expected bytes such as 24GiB"),
        (["--memory-budget", "8388608TiB"], "--memory-budget: expected bytes such as 24GiB"),
        *((["--memory-budget", bad], "--memory-budget: expected bytes such as 24GiB, or a multiple of the "
           f"checkpoint-all peak such as 1.5x, got '{bad}'")
          for bad in ("0x", "0.0x", "-1.5x", "+1.5x", "nanx", "infx", "1e2x", ".5x", "1.x", "2X", "x",
                      "1.0000000000000000001x")),
        (["--memory-budget", "99999999999999x"], "bytes (the checkpoint-all peak) times it overflows"),
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
    assert f"{path}:1:" in proc.stderr and "invalid JSON: number overflow" in proc.stderr


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
    assert f"{path}:1:" in proc.stderr and "invalid JSON: number overflow" in proc.stderr


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


@pytest.mark.parametrize("name,ranks,mbs,message", [
    ("1f1b", 512, 100000, "compute actions; at most 3000000 are generated"),
    ("zbv", 2, 1000000, "compute actions; at most 3000000 are generated"),
    ("zbv", 2048, 1, "at most 512 ranks are generated, got 2048"),
    ("zbv", 32767, 1, "at most 512 ranks are generated, got 32767"),
])
def test_generated_schedules_are_capped_before_allocating(name, ranks, mbs, message):
    proc = run_plan("--schedule-gen", name, "--ranks", str(ranks), "--microbatches", str(mbs), check=False)
    assert proc.returncode == 1
    assert message in proc.stderr  # refused, not attempted


# -o onto what is not a plain new file (issue: it used to be replaced by a regular file).
def test_output_through_a_symlink_replaces_the_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    run_plan("--emit", "json", "-o", str(link))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["format"] == "hp-recompute-plan"
    assert oct(target.stat().st_mode & 0o777) == oct(0o640), "an existing file keeps its mode"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def test_output_into_a_fifo_streams_and_keeps_the_fifo(tmp_path):
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen([str(PLAN_TOOL), "--emit", "json", "-o", str(fifo)], stderr=subprocess.PIPE)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    reader.join(timeout=60)
    if reader.is_alive():  # the tool never opened the FIFO: unblock the reader, then fail
        open(fifo, "w").close()
        reader.join()
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert fifo.is_fifo(), "the FIFO was replaced by a file"
    assert got and json.loads(got[0])["format"] == "hp-recompute-plan"


def test_output_to_dev_stdout_streams_without_replacing_it():
    proc = run_plan("--emit", "json", "-o", "/dev/stdout")
    assert json.loads(proc.stdout)["format"] == "hp-recompute-plan"
    assert os.path.islink("/dev/stdout") or not os.path.isfile("/dev/stdout")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_to_a_full_device_is_an_error_not_a_crash():
    proc = run_plan("--emit", "json", "-o", "/dev/full", check=False)
    assert proc.returncode == 1
    assert "-o /dev/full: cannot write: No space left on device" in proc.stderr
    assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")


def test_output_onto_a_directory_is_refused(tmp_path):
    proc = run_plan("--emit", "json", "-o", str(tmp_path), check=False)
    assert proc.returncode == 1
    assert f"-o {tmp_path}: is a directory" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_absurd_region_time_is_a_located_error(tmp_path):
    model = json.loads((REPO / "examples" / "gpt" / "gpt.model.json").read_text())
    model["regions"][1]["fwd_time_us"] = 1.7e308
    path = tmp_path / "m.json"
    path.write_text(json.dumps(model))
    out = tmp_path / "p.json"
    proc = run_plan("--model", str(path), "--schedule-gen", "1f1b", "--ranks", "2", "--emit", "json",
                    "-o", str(out), check=False)
    assert proc.returncode == 1
    assert f"{path}: /regions/1/fwd_time_us: expected a number between 0 and 1e12 us" in proc.stderr
    assert not out.exists()


def test_version_names_hp_recompute():
    proc = run_plan("--version")
    assert re.match(r"hp-recompute-plan \(hp-recompute \d+\.\d+\.\d+\), LLVM/MLIR 19\.", proc.stdout)


def test_a_huge_or_binary_cell_is_quoted_short_and_escaped(tmp_path: Path) -> None:
    """A megabyte cell is cut in the message (not echoed in full, twice); control bytes are escaped."""
    huge = tmp_path / "huge.csv"
    huge.write_text("0F0," + "X" * 1_000_000 + ",0B0\n")
    proc = run_plan("--schedule", str(huge), check=False)
    assert proc.returncode == 1
    assert len(proc.stderr) < 1000 and "... (1000000 bytes)" in proc.stderr, proc.stderr[:300]
    binary = tmp_path / "nul.csv"
    binary.write_bytes(b"0F0,0\x00B0\x1b\n")
    proc = run_plan("--schedule", str(binary), check=False)
    assert proc.returncode == 1
    assert "invalid action '0\\x00B0\\x1b'" in proc.stderr and "\x00" not in proc.stderr


@pytest.mark.parametrize("regions,where,message", [
    ("x", "/regions", "expected an array of checkpointed region indices, got '\"x\"'"),
    ([-1], "/regions/0", "expected a region index in [0, 1048576), got '-1'"),
    ([1, 0], "", "'hpr.recompute' op regions: expected ascending indices >= 0, each once, got 0 at position 1"),
    ([7], "", "replays region 7, but stage 0 checkpoints 4 regions (0..3) [hpr.verify.pieces]"),
    ([0, 3], "", "replays region 0 a second time (first at rank 0, action {piece} (recompute stage 0 mb 3)) "
                 "[hpr.verify.pieces]"),
], ids=["not-a-list", "negative", "unsorted", "out-of-range", "twice"])
def test_a_bad_piece_is_refused_where_it_stands(tmp_path, regions, where, message):
    """A replay in pieces (recompute ``regions``) edited by hand: each bad piece is an error at
    its JSON path, exit 1."""
    plan = tmp_path / "plan.json"
    gen = ["--model", str(REPO / "examples" / "gpt" / "gpt.model.json"), "--schedule-gen", "1f1b", "--ranks", "2",
           "--microbatches", "4"]
    # Pieces need room: within twice jit's peak rank 0 prefetches microbatch 3's last blocks.
    run_plan(*gen, "--prefetch", "bubble", "--memory-budget", "2x", "--emit", "json", "-o", str(plan))
    raw = json.loads(plan.read_text())
    actions = raw["ranks"][0]["actions"]
    piece = next(i for i, a in enumerate(actions) if a["op"] == "recompute" and a.get("regions")
                 and not a.get("in_backward") and a["regions"][-1] == 3)
    actions[piece]["regions"] = regions
    plan.write_text(json.dumps(raw))
    proc = run_plan("--verify", str(plan), check=False)
    assert proc.returncode == 1, proc.stderr
    inside = next(i for i, a in enumerate(actions) if a["op"] == "recompute" and a.get("in_backward")
                  and a["session"] == actions[piece]["session"])
    at = f"/ranks/0/actions/{inside if regions == [0, 3] else piece}{where}"
    assert f"{plan}: {at}" in proc.stderr and message.format(piece=piece) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("edit", ["missing", "short"])
def test_a_session_whose_regions_are_not_its_stages_is_refused(tmp_path, edit):
    """A runtime replays a session's ``regions`` and numbers a piece's regions by them: they
    are the stage's checkpointed regions in forward order, or the plan is refused at
    ``/sessions/N/regions`` before any rank runs."""
    plan = tmp_path / "plan.json"
    run_plan("--model", str(REPO / "examples" / "gpt" / "gpt.model.json"), "--schedule-gen", "1f1b", "--ranks", "2",
             "--microbatches", "4", "--emit", "json", "-o", str(plan))
    raw = json.loads(plan.read_text())
    if edit == "missing":
        del raw["sessions"][0]["regions"]
    else:
        raw["sessions"][0]["regions"] = raw["sessions"][0]["regions"][:-1]
    plan.write_text(json.dumps(raw))
    proc = run_plan("--verify", str(plan), check=False)
    assert proc.returncode == 1, proc.stderr
    assert (f"{plan}: /sessions/0/regions: expected the checkpointed regions of stage 0, in order: "
            f'["blocks.0","blocks.1","blocks.2","blocks.3"], got') in proc.stderr, proc.stderr
