"""Single-process runs of real plans: bit-exact gradients, one replay per checkpointed region and
session, no leaks.

The expected numbers come from the plan (its sessions and region lists) and from a plain
step of the model's own ``forward``, never from the runner itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpr_run_util import (GPT_MODEL_JSON, count_plan, edit_plan, flags, make_plan, model_json, pieces_plan,
                          run_inproc)

CONFIGS = [("zbv", 2, 4), ("1f1b", 2, 4), ("dualpipev", 4, 8)]


@pytest.mark.parametrize("prefetch", ["jit", "lookahead=2", "bubble"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}")
def test_plan_is_bit_exact(tmp_path: Path, cfg, prefetch: str) -> None:
    pieces = prefetch == "bubble" and cfg == ("1f1b", 2, 4)  # 1F1B's pieces need room: pieces_plan
    plan = (pieces_plan(tmp_path, "--model", str(GPT_MODEL_JSON))[1] if pieces
            else make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(cfg), "--prefetch", prefetch))
    code, report = run_inproc("--plan", str(plan), "--single-process", "--report", str(tmp_path / "r.json"))
    raw = json.loads(plan.read_text())
    assert code == 0, report
    assert report["ok"] is True
    assert report["grads_match"] is True and report["comparison"] == "torch.equal"
    assert report["max_abs_diff"] == 0.0
    # Each session recomputed: by one recompute, or in pieces (bubble: a replay's last blocks
    # prefetched, the rest inside its backward).
    recomputed = [a["session"] for r in raw["ranks"] for a in r["actions"] if a["op"] == "recompute"]
    assert report["sessions"] == len(raw["sessions"]) == len(set(recomputed))
    if pieces:  # run bit-exact too
        assert len(recomputed) > len(raw["sessions"]), recomputed
    # The stages are the planner's: each session replays its stage's checkpointed regions once.
    assert report["stages"] == {str(s): [r["name"] for r in regions["regions"]]
                                for s, regions in enumerate(raw["model"]["stages"])}
    assert report["recomputes"] == sum(len(s["regions"]) for s in raw["sessions"]) == report["recomputes_expected"]
    assert report["sessions_left"] == 0
    assert report["counters"]["plain_replays"] == 0
    assert report["counters"]["clears"] == count_plan(plan, "clear")
    assert report["loss"] == report["reference_loss"]


def test_gpt_model_plan_runs_bit_exact(tmp_path: Path) -> None:
    """Planned with the GPT's model JSON: region names map 1:1, every region replays once."""
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    code, report = run_inproc("--plan", str(plan), "--single-process", "--steps", "2",
                              "--report", str(tmp_path / "r.json"))
    raw = json.loads(plan.read_text())
    assert code == 0, report
    assert report["grads_match"] is True and report["max_abs_diff"] == 0.0
    # Each session replays every checkpointed region of its stage once, per step.
    assert report["recomputes"] == 2 * sum(len(s["regions"]) for s in raw["sessions"])
    assert report["recomputes"] == report["recomputes_expected"]
    assert report["stages"]["0"] == ["tok_emb", "blocks.0", "blocks.1"]
    # One process runs every rank: no per-rank allocator peak.
    assert all(rank["measured_peak_bytes"] is None for rank in report["ranks"])


@pytest.mark.parametrize("mode", ["plan", "native"])
def test_auto_plan_runs_plain_microbatches_bit_exact(tmp_path: Path, mode: str) -> None:
    """--checkpoint auto keeps some microbatches plain: those forwards checkpoint nothing."""
    every = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)), name="all.json")
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)),
                     "--checkpoint", "auto", "--memory-budget", "1x", "--prefetch", "bubble")
    raw = json.loads(plan.read_text())
    plain = [a for r in raw["ranks"] for a in r["actions"] if a.get("checkpoint") is False]
    assert plain, "the budget leaves room for plain microbatches"
    code, report = run_inproc("--plan", str(plan), "--single-process", "--checkpoint-mode", mode,
                              "--report", str(tmp_path / "r.json"))
    assert code == 0, report
    assert report["grads_match"] is True and report["max_abs_diff"] == 0.0
    if mode == "plan":
        # Only the sessions replay: plain microbatches were never checkpointed.
        assert report["recomputes"] == sum(len(s["regions"]) for s in raw["sessions"])
        assert report["counters"]["plain_replays"] == 0
    else:
        # torch.utils.checkpoint replays the checkpointed microbatches only (how often per
        # backward call depends on the torch version): fewer than with every one checkpointed.
        assert report["recomputes"] > 0
        code, all_report = run_inproc("--plan", str(every), "--single-process", "--checkpoint-mode", mode,
                                      "--report", str(tmp_path / "all-report.json"))
        assert code == 0
        assert report["recomputes"] < all_report["recomputes"]


@pytest.mark.parametrize("gen", ["zb-h1", "zbv"])
def test_a_plan_that_replays_sessions_again_for_their_dw_runs_bit_exact(tmp_path: Path, gen: str) -> None:
    """hpr.exec.replay-for-weight: under a budget the deferred dws exceed, the planner drops sessions' replays after
    their dx and replays them again for their dw; the runner replays each of those sessions' regions twice, and
    the gradients are the plain step's, bit for bit."""
    # Budgets at which the bundled GPT (its exported bwd_weight_input_bytes and
    # replay_weight_bytes counted) replays a dw again: 0.6x and 0.5x did until the model said
    # what a dx keeps for its dw and releases of a replay.
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags((gen, 2, 4)), "--memory-budget",
                     "0.9x" if gen == "zb-h1" else "0.7x")
    raw = json.loads(plan.read_text())
    again = [a["session"] for r in raw["ranks"] for a in r["actions"] if a.get("for_weight")]
    assert again, "the budget makes the planner replay some sessions for their dw"
    code, report = run_inproc("--plan", str(plan), "--single-process", "--report", str(tmp_path / "r.json"))
    assert code == 0, report
    assert report["grads_match"] is True and report["max_abs_diff"] == 0.0
    regions = {s["id"]: len(s["regions"]) for s in raw["sessions"]}
    assert report["recomputes"] == sum(regions.values()) + sum(regions[s] for s in again)


def test_leaked_session_is_refused(tmp_path: Path) -> None:
    """A plan that never clears one session is refused before it runs (exit 1)."""
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))

    def drop_first_clear(p):
        actions = p["ranks"][0]["actions"]
        actions.pop(next(i for i, a in enumerate(actions) if a["op"] == "clear"))

    bad = edit_plan(plan, tmp_path / "leak.json", drop_first_clear)
    code, report = run_inproc("--plan", str(bad), "--single-process", "--report", str(tmp_path / "r.json"))
    assert code == 1
    assert report["ok"] is False and "is never cleared: its recomputed tensors leak" in report["error"]


MODEL_PY = '''
import torch, torch.nn as nn
from hp_recompute.runner import PipelineModel, Region

def build(scale=1.0):
    torch.manual_seed(0)
    m = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])
    def lin(i):
        return lambda x, b: torch.tanh(m[i](x))
    regions = [Region(f"l{i}", lin(i), [f"{i}.weight", f"{i}.bias"]) for i in range(3)]
    regions.append(Region("l3", lambda x, b: m[3](x).pow(2).mean(), ["3.weight", "3.bias"]))
    def ref(b):
        x = b
        for i in range(3):
            x = torch.tanh(m[i](x))
        return m[3](x).pow(2).mean() * scale
    return PipelineModel("tiny", m, regions, lambda g: torch.randn(2, 8, generator=g), ref)

def build_wrong():
    return build(scale=1.001)

def build_tuple():
    model = build()
    first = model.regions[0]
    model.regions[0] = Region("l0", lambda x, b: (first.fn(x, b), x), first.params)
    model.regions[1] = Region("l1", lambda x, b, f=model.regions[1].fn: f(x[0], b), model.regions[1].params)
    return model
'''


def tiny_json(tmp: Path) -> Path:
    """The tiny model's JSON graph: four checkpointable regions l0..l3."""
    return model_json(tmp, "tiny", ["l0", "l1", "l2", "l3"])


def test_tuple_stage_boundaries_are_refused_naming_the_region(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(MODEL_PY)
    plan = make_plan(tmp_path, "--model", str(tiny_json(tmp_path)), *flags(("1f1b", 2, 4)))
    code, report = run_inproc("--plan", str(plan), "--single-process", "--model", f"{tmp_path}/tiny.py:build_tuple",
                              "--report", str(tmp_path / "r.json"))
    assert code == 1
    assert "region 'l0' returns tuple, but every region but the last must return one tensor" in report["error"]


def test_custom_model_and_wrong_reference(tmp_path: Path) -> None:
    """--model FILE.py:FACTORY returning a PipelineModel; regions that differ from it are refused."""
    (tmp_path / "tiny.py").write_text(MODEL_PY)
    plan = make_plan(tmp_path, "--model", str(tiny_json(tmp_path)), *flags(("1f1b", 2, 4)))
    code, report = run_inproc("--plan", str(plan), "--single-process", "--model", f"{tmp_path}/tiny.py:build",
                              "--report", str(tmp_path / "r.json"))
    assert code == 0, report
    assert report["model"] == "tiny" and report["stages"] == {"0": ["l0", "l1"], "1": ["l2", "l3"]}
    code, report = run_inproc("--plan", str(plan), "--single-process", "--model", f"{tmp_path}/tiny.py:build_wrong",
                              "--report", str(tmp_path / "r2.json"))
    assert code == 1
    assert "model 'tiny': its regions in order give loss" in report["error"]
    assert "the regions do not compute the model" in report["error"]


def test_bad_inputs_are_located(tmp_path: Path, capsys) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    code, report = run_inproc("--plan", str(plan), "--world-size", "3", "--report", str(tmp_path / "r.json"))
    assert code == 1
    assert "--world-size 3 does not match the plan's 2 ranks" in report["error"]

    bad = edit_plan(plan, tmp_path / "bad.json", lambda p: p["ranks"][1]["actions"][1].update(peer="x"))
    code, report = run_inproc("--plan", str(bad), "--single-process", "--report", str(tmp_path / "r.json"))
    assert code == 1
    assert f"{bad}: /ranks/1/actions/1/peer: expected an integer in [0, 1], got '\"x\"'" in report["error"]

    def rename(p: dict) -> None:  # a consistent plan (its sessions too) naming a region the model lacks
        region = p["model"]["stages"][1]["regions"][0]
        for session in p["sessions"]:
            session["regions"] = ["blocks.99" if name == region["name"] else name for name in session["regions"]]
        region["name"] = "blocks.99"

    renamed = edit_plan(plan, tmp_path / "renamed.json", rename)
    code, report = run_inproc("--plan", str(renamed), "--single-process", "--report", str(tmp_path / "r.json"))
    assert code == 1
    assert "/model/stages/1/regions/0/name: region 'blocks.99' is not in model 'gpt'" in report["error"]
    assert "hp_recompute.run:" in capsys.readouterr().err

    # Summary fields the report compares with are numbers (one per rank for lists).
    for key, value, expected in (("step_time_us", "fast", "expected a finite number, got '\"fast\"'"),
                                 ("busy_us", [1.0], "expected a list of 2 finite numbers, got '[1.0]'")):
        def summary(p, key=key, value=value):
            p["summary"][key] = value
        odd = edit_plan(plan, tmp_path / "summary.json", summary)
        code, report = run_inproc("--plan", str(odd), "--single-process", "--report", str(tmp_path / "r.json"))
        assert code == 1
        assert f"{odd}: /summary/{key}: {expected}" in report["error"]

    # A plan ordered wrongly is refused before any rank runs, naming the action and the rule.
    def send_before_forward(p):
        actions = p["ranks"][0]["actions"]
        actions[0], actions[1] = actions[1], actions[0]
    swapped = edit_plan(plan, tmp_path / "swapped.json", send_before_forward)
    code, report = run_inproc("--plan", str(swapped), "--single-process", "--report", str(tmp_path / "r.json"))
    assert code == 1
    assert ("/ranks/0/actions/0: error: rank 0, action 0 (0SEND_F0): send before the action that produces it "
            "(rank 0, action 1 (0F0))") in report["error"]

    # checkpoint: only on a forward (actions 0, 2: forwards; 1: send_f), false never on one whose
    # microbatch has a session (the planner's reader and verifier say so).
    for index, value, expected in ((1, False, "/ranks/0/actions/1/checkpoint: unknown key"),
                                   (2, False, '/ranks/0/actions/2: error: rank 0, action 2 (forward stage 0 mb 1): '
                                              'session "s0.mb1" replays a forward marked no_checkpoint')):
        def mark(p, index=index, value=value):
            p["ranks"][0]["actions"][index]["checkpoint"] = value
        marked = edit_plan(plan, tmp_path / "marked.json", mark)
        code, report = run_inproc("--plan", str(marked), "--single-process", "--report", str(tmp_path / "r.json"))
        assert code == 1
        assert expected in report["error"]


def test_deadlocked_plan_is_reported(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))

    def drop_second_send(p):
        actions = p["ranks"][0]["actions"]
        actions.pop([i for i, a in enumerate(actions) if a["op"] == "send_f"][1])

    bad = edit_plan(plan, tmp_path / "dead.json", drop_second_send)
    code, report = run_inproc("--plan", str(bad), "--single-process", "--report", str(tmp_path / "r.json"))
    assert code == 1
    assert "/ranks/0/actions/2: error: rank 0, action 2 (0F1): no SEND_F after it (stage 1 is on rank 1)" \
        in report["error"]


def test_native_mode_counts_replays_per_step(tmp_path: Path) -> None:
    """--checkpoint-mode native: each step reports its own replays, not a running total."""
    (tmp_path / "tiny.py").write_text(MODEL_PY)
    plan = make_plan(tmp_path, "--model", str(tiny_json(tmp_path)), *flags(("zbv", 2, 4)))
    totals = {}
    for steps in (1, 3):
        code, report = run_inproc("--plan", str(plan), "--single-process", "--checkpoint-mode", "native",
                                  "--model", f"{tmp_path}/tiny.py:build", "--steps", str(steps),
                                  "--report", str(tmp_path / f"r{steps}.json"))
        assert code == 0, report
        assert report["checkpoint_mode"] == "native" and report["recomputes_expected"] is None
        totals[steps] = report["recomputes"]
    # Every step runs the same actions: a per-step count sums to steps x one step's count
    # (a count carried over between steps would give 1 + 2 + 3 = 6 times it).
    assert totals[1] > 0
    assert totals[3] == 3 * totals[1]


def test_unusable_report_paths_are_refused_before_the_run(tmp_path: Path, capsys) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    from hp_recompute import run as runner

    for report, message in ((tmp_path / "missing" / "r.json", "no directory"), (tmp_path, "is a directory")):
        assert runner.main(["--plan", str(plan), "--single-process", "--report", str(report)]) == 1
        assert f"hp_recompute.run: --report {report}: {message}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"], "no stray temporary file"


def test_report_goes_through_a_symlink_and_keeps_the_mode(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    target = tmp_path / "kept.json"
    target.write_text("{}")
    target.chmod(0o644)
    link = tmp_path / "r.json"
    link.symlink_to(target)
    code, report = run_inproc("--plan", str(plan), "--single-process", "--report", str(link))
    assert code == 0 and report["ok"] is True
    assert link.is_symlink() and json.loads(target.read_text())["ok"] is True
    assert target.stat().st_mode & 0o777 == 0o644


def test_zero_threads_is_a_usage_error(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    from hp_recompute import run as runner

    with pytest.raises(SystemExit) as exit_info:
        runner.main(["--plan", str(plan), "--single-process", "--threads", "0"])
    assert exit_info.value.code == 2

