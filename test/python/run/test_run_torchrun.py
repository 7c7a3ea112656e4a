"""``hp_recompute.run`` under torchrun: one node, and two "nodes" in network namespaces.

The two-node test builds two network namespaces joined by a veth pair (iproute2), starts
``torchrun --nnodes 2`` in each with the rendezvous on the first namespace's address,
and checks that the gradients of the run match the reference step. It needs root and
``ip netns``; elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from hpr_run_util import GPT_MODEL_JSON, PYTHON_DIR, make_plan, processes_left, reaped

pytestmark = pytest.mark.slow  # starts rank processes or torchrun (test/python/conftest.py)



def torchrun(log_dir: Path) -> List[str]:
    """torchrun of this interpreter's torch (options spelled with underscores: torch 1.13 has no others).

    torch 1.13's launcher breaks on Python 3.11 with its default ``--redirects 0`` (its
    ``Std`` flag enum finds no member for 0 there); redirecting stdout to a log and
    teeing it back avoids that code path.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if int(torch.__version__.split(".")[0]) < 2:
        cmd += ["--redirects", "1", "--tee", "1", "--log_dir", str(log_dir)]
    return cmd


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PYTHON_DIR) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _zbv_plan(tmp: Path) -> Path:
    return make_plan(tmp, "--schedule-gen", "zbv", "--ranks", "2", "--microbatches", "4",
                     "--model", str(GPT_MODEL_JSON))


def test_torchrun_single_node(tmp_path: Path) -> None:
    plan, report = _zbv_plan(tmp_path), tmp_path / "report.json"
    proc = subprocess.run([*torchrun(tmp_path / "logs"), "--standalone", "--nproc_per_node", "2", "-m", "hp_recompute.run",
                           "--plan", str(plan), "--steps", "2", "--report", str(report)],
                          capture_output=True, text=True, env=_env(), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(report.read_text())
    assert got["ok"] and got["grads_match"] and got["mode"] == "torchrun (2 processes)"
    assert got["recomputes"] == got["recomputes_expected"] > 0
    assert "grads_match true" in proc.stdout


def test_torchrun_refuses_a_broken_plan_on_every_rank(tmp_path: Path) -> None:
    plan = json.loads(_zbv_plan(tmp_path).read_text())
    actions = plan["ranks"][1]["actions"]
    del actions[next(i for i, a in enumerate(actions) if a["op"] == "send_f")]  # a receive waits forever
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(plan))
    proc = subprocess.run([*torchrun(tmp_path / "logs"), "--standalone", "--nproc_per_node", "2", "-m", "hp_recompute.run",
                           "--plan", str(broken)], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.count("no SEND_F after it") == 2, proc.stderr  # both ranks, before running


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def two_namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2's ip netns")
    tag = str(os.getpid() % 10000)
    names = [f"hpr{tag}a", f"hpr{tag}b"]
    veths = [f"hv{tag}a", f"hv{tag}b"]
    addrs = ["10.231.0.1", "10.231.0.2"]
    try:
        for n in names:
            _ip("netns", "add", n)
        _ip("link", "add", veths[0], "type", "veth", "peer", "name", veths[1])
        for n, v, a in zip(names, veths, addrs):
            _ip("link", "set", v, "netns", n)
            _ip("-n", n, "addr", "add", f"{a}/24", "dev", v)
            _ip("-n", n, "link", "set", v, "up")
            _ip("-n", n, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        for n in names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        pytest.skip(f"cannot make network namespaces here: {e.stderr.strip()}")
    yield list(zip(names, veths, addrs))
    for n in names:
        subprocess.run(["ip", "netns", "del", n], capture_output=True)


def test_torchrun_two_nodes_over_a_veth_link(tmp_path: Path, two_namespaces) -> None:
    plan = _zbv_plan(tmp_path)
    master = two_namespaces[0][2]
    procs: List[subprocess.Popen] = []
    for node, (ns, veth, _) in enumerate(two_namespaces):
        env = _env()
        env["GLOO_SOCKET_IFNAME"] = veth  # the namespace's only link to the other node
        cmd = ["ip", "netns", "exec", ns, *torchrun(tmp_path / f"logs{node}"), "--nnodes", "2", "--node_rank", str(node),
               "--nproc_per_node", "1", "--rdzv_backend", "static", "--master_addr", master,
               "--master_port", "29517", "-m", "hp_recompute.run", "--plan", str(plan), "--steps", "2",
               "--report", str(tmp_path / f"report{node}.json")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err
    got = json.loads((tmp_path / "report0.json").read_text())  # node 0 holds global rank 0
    assert got["ok"] and got["grads_match"] and got["world_size"] == 2
    assert not (tmp_path / "report1.json").exists()


def test_torchrun_a_rank_killed_mid_step_stops_the_run(tmp_path: Path) -> None:
    """SIGKILL on rank 1: torchrun names it, stops rank 0, and nothing outlives the run."""
    plan = _zbv_plan(tmp_path)
    env = _env()
    env["HPR_RUN_FAIL_AT"] = "1:6:kill"
    marker = f"hpr-torchrun-kill-{os.getpid()}"
    env["HPR_TEST_RUN"] = marker
    # Not the 600 s receive timeout: that would pass the test's own limit (TimeoutExpired).
    with reaped(marker):
        proc = subprocess.run([*torchrun(tmp_path / "logs"), "--standalone", "--nproc_per_node", "2", "-m",
                               "hp_recompute.run", "--plan", str(plan), "--timeout", "600"],
                              capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode != 0
    # torchrun's failure report names the killed rank (as the root cause, or beside rank 0's
    # closed-connection error when both end within its clock resolution).
    assert re.search(r"rank\s+: 1 \(local_rank: 1\)\s+exitcode\s+: -9", proc.stderr), proc.stderr[-2000:]
    assert processes_left(marker) == [], "a rank outlived the run"


# -- the process group cannot form: one located line and exit 1, bounded by --timeout --------
# Run as torchrun starts a worker (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): under torchrun
# itself the agent's own rendezvous would fail first, before our process joins.

def _as_worker(plan: Path, rank: int, port: int) -> subprocess.CompletedProcess:
    env = _env()
    env.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port)})
    # --timeout 2: a group that waited for anything but its own bound would pass the test's limit.
    return subprocess.run([sys.executable, "-m", "hp_recompute.run", "--plan", str(plan), "--timeout", "2"],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("case", ["port-in-use", "peer-never-joins", "silent-master"])
def test_a_group_that_cannot_form_is_one_line_and_exit_1(tmp_path: Path, case: str) -> None:
    import socket

    plan = _zbv_plan(tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        if case != "peer-never-joins":
            holder.listen()  # another program on MASTER_PORT: accepts, never answers
        else:
            holder.close()
        proc = _as_worker(plan, 1 if case == "silent-master" else 0, port)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    rank = 1 if case == "silent-master" else 0
    assert lines[0].startswith(f"hp_recompute.run: rank {rank}: the process group of 2 ranks did not form "
                               f"(MASTER_ADDR 127.0.0.1, MASTER_PORT {port}, --timeout 2 s): "), lines[0]
    want = {"port-in-use": "already in use", "peer-never-joins": "",
            "silent-master": "no answer within 7 s (is another program listening on MASTER_PORT?)"}[case]
    assert want.lower() in lines[0].lower()
