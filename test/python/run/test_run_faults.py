"""The runner under hostile input and faults: its outputs, model code that exits or raises,
a stopped rank, numeric flags out of range, and a plan of the uniform model (no partition to run).

Every case checks the exit status and the message; none may print a traceback or hang.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpr_run_util import (GPT_MODEL_JSON, MLP_EXAMPLE, PYTHON_DIR, REPO, device_node, flags, make_plan,
                          mlp_regions, model_json, processes_left, processes_with, run_cli)

pytestmark = pytest.mark.slow  # starts rank processes or torchrun (test/python/conftest.py)

# A module laid out as the bundled MLP (inp, layers.N, head), run as its pipeline model.
MLP = f'''
import sys, torch, torch.nn as nn
{MLP_EXAMPLE}
class Net(nn.Module):
    def __init__(self, fail=None):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(12, 16)
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(4)])
        self.head = nn.Linear(16, 5)
        self.fail = fail
        self.calls = 0

    def forward(self, x):
        h = torch.relu(self.inp(x))
        for layer in self.layers:
            h = layer(h)
        return self.head(h)

def net():
    return mlp_example.pipeline(Net())

def _failing(exc):
    net = Net()
    layer = net.layers[1]
    def forward(x):
        net.calls += 1
        if net.calls > 2:  # the runner first checks the regions against the forward, once each
            raise exc
        return nn.Linear.forward(layer, x)
    layer.forward = forward
    return mlp_example.pipeline(net)

def exits():
    return _failing(SystemExit(0))

def interrupted():
    return _failing(KeyboardInterrupt())

def raises_in_factory():
    raise ValueError("no weights for this size")

def exits_in_factory():
    sys.exit(0)
'''


def _mlp_json(tmp: Path) -> Path:
    """MLP's model JSON graph (its pipeline model's regions, 4 layers), to plan it with."""
    return model_json(tmp, "mlp", mlp_regions(4), plain=("inp", "head"))


@pytest.fixture
def mlp(tmp_path: Path) -> str:
    (tmp_path / "mlp.py").write_text(MLP)
    return str(tmp_path / "mlp.py")


def _runner(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = run_cli(*args, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


# -- outputs (NOTE [ Output files ] in output_files.py) ------------------------------------


def test_report_onto_a_character_device_keeps_thedevice_node(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    null = device_node(tmp_path, "null", 3)
    proc = _runner("--plan", str(plan), "--single-process", "--report", str(null))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(null.stat().st_mode), "the device became a regular file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "p.json"]


def test_report_onto_dev_full_is_a_write_error(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    full = device_node(tmp_path, "full", 7)
    proc = _runner("--plan", str(plan), "--single-process", "--report", str(full))
    assert proc.returncode == 1
    assert f"hp_recompute.run: --report {full}: cannot write: No space left on device" in proc.stderr
    assert stat.S_ISCHR(full.stat().st_mode), "the device became a regular file"


FULL_DISK_RUN = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))  # a report is longer
from hp_recompute import run
sys.exit(run.main(sys.argv[1:]))
"""


def test_a_full_disk_leaves_the_old_report_byte_identical(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    report = tmp_path / "r.json"
    old = b'{"an": "older report"}\n'
    report.write_bytes(old)
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    proc = subprocess.run([sys.executable, "-c", FULL_DISK_RUN, "--plan", str(plan), "--single-process",
                           "--report", str(report)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    assert f"hp_recompute.run: --report {report}: cannot write: File too large; {report} is unchanged" \
        in proc.stderr
    assert report.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "r.json"], "no temporary left"


def test_report_onto_a_symlink_loop_is_refused_and_the_link_kept(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    proc = _runner("--plan", str(plan), "--single-process", "--report", str(loop))
    assert proc.returncode == 1
    assert f"hp_recompute.run: --report {loop}: a symlink loop" in proc.stderr
    assert loop.is_symlink() and os.readlink(loop) == str(loop)


def test_an_empty_report_path_is_a_usage_error(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    proc = _runner("--plan", str(plan), "--single-process", "--report", "")
    assert proc.returncode == 2
    assert "hp_recompute.run: --report: an empty path; give a file, or - for stdout" in proc.stderr


@pytest.mark.parametrize("via", ["same-path", "hard-link"])
def test_a_report_onto_the_plan_is_refused_before_the_run(tmp_path: Path, via: str) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    before = plan.read_bytes()
    report = plan if via == "same-path" else tmp_path / "r.json"
    if via == "hard-link":
        os.link(plan, report)
    proc = _runner("--plan", str(plan), "--report", str(report))
    assert proc.returncode == 2  # a usage error: refused before any rank was started
    assert f"hp_recompute.run: --report {report} is the same file as the input --plan {plan}" in proc.stderr
    assert plan.read_bytes() == before


def test_a_report_onto_the_model_file_is_refused(tmp_path: Path, mlp: str) -> None:
    plan = make_plan(tmp_path, "--model", str(_mlp_json(tmp_path)), *flags(("zbv", 2, 4)))
    proc = _runner("--plan", str(plan), "--model", f"{mlp}:net", "--single-process", "--report", mlp)
    assert proc.returncode == 2
    assert f"--report {mlp} is the same file as the input --model {mlp}" in proc.stderr
    assert Path(mlp).read_text() == MLP


def test_report_to_stdout(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    proc = _runner("--plan", str(plan), "--single-process", "--report", "-")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True  # the summary went to stderr
    assert "grads_match true" in proc.stderr


# -- model code that exits or raises -------------------------------------------------------


@pytest.mark.parametrize("factory,what", [("exits", "SystemExit: 0"), ("interrupted", "KeyboardInterrupt")])
def test_model_code_that_exits_is_a_failed_run(tmp_path: Path, mlp: str, factory: str, what: str) -> None:
    plan = make_plan(tmp_path, "--model", str(_mlp_json(tmp_path)), *flags(("zbv", 2, 4)))
    report = tmp_path / "r.json"
    proc = _runner("--plan", str(plan), "--model", f"{mlp}:{factory}", "--single-process", "--report", str(report))
    assert proc.returncode == 1, proc.stderr
    failure = json.loads(report.read_text())
    assert failure["ok"] is False
    # Located at the action that ran the model (stage 1 holds layers.1), and at the model's own line.
    assert re.search(r"hp_recompute.run: rank \d+ action \d+ \(forward stage 1 mb 0\): " + what, failure["error"])
    assert f"(at {mlp}:" in failure["error"]
    assert failure["error"] in proc.stderr


@pytest.mark.parametrize("factory,what", [("raises_in_factory", "ValueError: no weights for this size"),
                                          ("exits_in_factory", "SystemExit: 0")])
@pytest.mark.parametrize("mode", ["--single-process", "multi-process"])
def test_a_factory_that_raises_is_one_located_line(tmp_path: Path, mlp: str, factory: str, what: str,
                                                   mode: str) -> None:
    plan = make_plan(tmp_path, "--model", str(_mlp_json(tmp_path)), *flags(("zbv", 2, 4)))
    report = tmp_path / "r.json"
    proc = _runner("--plan", str(plan), "--model", f"{mlp}:{factory}", "--report", str(report),
                   *([mode] if mode.startswith("--") else []))
    assert proc.returncode == 1
    want = f"hp_recompute.run: --model: {factory}() in '{mlp}' raised {what} (at {mlp}:"
    assert proc.stderr.startswith(want), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert json.loads(report.read_text())["error"].startswith(want)


# -- a stopped rank ------------------------------------------------------------------------


def _stopped_since(marker: str) -> bool:
    """Whether a process of the run (``marker`` in its environment) is stopped (state T)."""
    for pid in processes_with(marker):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "T":
                    return True
        except OSError:
            pass
    return False


def test_a_stopped_rank_is_killed_named_and_the_run_ends(tmp_path: Path) -> None:
    """SIGSTOP takes no SIGTERM: the parent follows up with SIGKILL and reaps every rank, within
    the test's limit (a run that waited for the stopped rank would hang)."""
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    report = tmp_path / "r.json"
    marker = f"hpr-stopped-{os.getpid()}"
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), HPR_RUN_FAIL_AT="1:6:stop", HPR_TEST_RUN=marker)
    proc = subprocess.Popen([sys.executable, "-m", "hp_recompute.run", "--plan", str(plan), "--timeout", "1",
                             "--report", str(report)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    deadline = time.monotonic() + 120
    while not _stopped_since(marker) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid] + processes_with(marker):
            os.kill(pid, signal.SIGKILL)
        raise AssertionError("the run hangs on a stopped rank") from None
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert ("rank 1 was stopped (SIGSTOP or a debugger): SIGTERM did not end it within 1 s, the runner killed "
            "it (SIGKILL); it left no result") in stderr, stderr
    assert "rank 0 failed first" not in stderr and "timeout 1 s" in stderr  # the peer that waited for it
    results = json.loads(report.read_text())["rank_results"]
    assert results[1]["exit_code"] == -9 and results[1]["error"] is None
    assert processes_left(marker) == [], "a rank outlived the run"


# -- numeric flags -------------------------------------------------------------------------


@pytest.mark.parametrize("flag,value,message", [
    ("--steps", str(10**20), f"--steps must be in [1, 100000], got {10**20}"),
    ("--timeout", "nan", "--timeout must be a number of seconds in (0, 604800], got nan"),
    ("--timeout", "inf", "--timeout must be a number of seconds in (0, 604800], got inf"),
    ("--seed", str(10**23), f"--seed must be in [0, 2^40), got {10**23}"),
    ("--threads", "100000", "--threads must be in [1, 1024], got 100000"),
    ("--world-size", "100000", "--world-size must be in [1, 4096], got 100000"),
    ("--model", "", "--model: an empty value"),
])
def test_numeric_flags_out_of_range_are_usage_errors(tmp_path: Path, flag: str, value: str, message: str) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    proc = _runner("--plan", str(plan), flag, value, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr


# -- a plan of the uniform model -----------------------------------------------------------


UNIFORM = "is the uniform model's (planned without --model), which does not say which of model"


@pytest.mark.parametrize("mode", ["--single-process", "multi-process"])
def test_a_plan_of_the_uniform_model_is_refused_naming_the_model_json(tmp_path: Path, mode: str) -> None:
    """No --model when planning: the runner has no partition of its own and says which JSON to plan."""
    plan = make_plan(tmp_path, *flags(("zbv", 2, 4)))
    report = tmp_path / "r.json"
    proc = run_cli("--plan", str(plan), "--report", str(report), *([mode] if mode.startswith("--") else []),
                   cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    want = (f"hp_recompute.run: {plan}: /model/stages/0/regions/0/name: region 'stage0' {UNIFORM} 'gpt''s "
            f"regions each stage runs; plan the model: hp-recompute-plan --model examples/gpt/gpt.model.json and "
            f"this plan's schedule flags")
    assert proc.stderr.strip() == want
    assert json.loads(report.read_text())["error"] == want  # refused before any rank was started


def test_a_uniform_plan_for_the_bundled_mlp_names_its_json(tmp_path: Path) -> None:
    """The bundled JSON is found by the model's name and regions; outside the checkout, by its full path."""
    plan = make_plan(tmp_path, *flags(("1f1b", 2, 4)))
    proc = run_cli("--plan", str(plan), "--model", f"{REPO}/examples/mlp/model.py:pipeline", "--single-process",
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert (f"region 'stage0' {UNIFORM} 'mlp''s regions each stage runs; plan the model: hp-recompute-plan "
            f"--model {REPO}/examples/mlp/mlp.model.json and this plan's schedule flags\n") == \
        proc.stderr.split(": /model/stages/0/regions/0/name: ", 1)[1]


def test_a_uniform_plan_for_a_model_of_ones_own_says_what_its_json_holds(tmp_path: Path, mlp: str) -> None:
    plan = make_plan(tmp_path, *flags(("zbv", 2, 4)))
    proc = _runner("--plan", str(plan), "--model", f"{mlp}:net", "--single-process")
    assert proc.returncode == 1
    assert (f"region 'stage0' {UNIFORM} 'mlp''s regions each stage runs; plan the model: hp-recompute-plan "
            f"--model MODEL.json and this plan's schedule flags, MODEL.json being model 'mlp''s JSON graph with its "
            f"regions [inp, layers.0, layers.1, layers.2, layers.3, head] (docs/models.md") in proc.stderr
    # Planned with that JSON, the same model runs.
    plan = make_plan(tmp_path, "--model", str(_mlp_json(tmp_path)), *flags(("zbv", 2, 4)), name="m.json")
    proc = _runner("--plan", str(plan), "--model", f"{mlp}:net", "--single-process")
    assert proc.returncode == 0, proc.stderr


def test_a_plan_for_fsdp_stages_is_refused_before_any_rank_runs(tmp_path: Path) -> None:
    """The runner has no data parallelism: a plan made with --dp-shard would run unsharded,
    outside its step time and memory, so it is refused, naming the plan's layout."""
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)), "--dp-shard", "2")
    proc = _runner("--plan", str(plan))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(f"hp_recompute.run: {plan}: /model/data_parallel: the plan is made for FSDP2 "
                                  f"stages (shard 2, replicate 1), and the runner has no data parallelism"), proc.stderr
