"""PP 2 x FSDP2 on gloo: step time, collectives and peak memory of torch's schedules against PlannedSchedule.

Four processes form a (pp 2, dp 2) mesh and train one of two models, split into 4 stages
in a V, wrapped as torchtitan does (checkpoint-wrap each block, then ``fully_shard`` each
block and the stage). ``--model net`` (the default): the model of the PlannedSchedule
tests (test/python/pipelining/pp_worker.py: residual MLP blocks ``layers.N`` and a head,
``--dim`` wide and ``--layers`` deep), MSE on random targets. ``--model decoder``: the
held-out torchtitan-layout decoder of examples/pipelining/model.py (``tok_embeddings``,
blocks ``layers.N`` of causal self-attention and MLP, ``norm`` and ``output``; its own
sizes), cross-entropy on the next token, as examples/pipelining/train.py trains it.
``--model llama``: the Llama example in torchtitan's layout (examples/llama/model.py: RMSNorm,
rotary embeddings, grouped-query attention, SwiGLU; 4 blocks, one per stage), its own
stage modules and next-token loss. Per
``reshard_after_forward`` setting, side by side in one run and repeated:

* none: PlannedSchedule with a ZBV plan that checkpoints nothing;
* torch interleaved 1F1B + checkpoint: torch's ``ScheduleInterleaved1F1B`` (stages in loops)
  with torch's ``checkpoint_wrapper``: the strongest correct baseline, the ratio column's;
* torch ZBV + checkpoint: torch's ``ScheduleZBVZeroBubble`` with torch's ``checkpoint_wrapper``;
* ours jit / ours bubble: PlannedSchedule with ``hp_recompute.checkpoint_wrapper`` blocks
  and a ZBV plan that checkpoints every block, replays placed just in time or in bubbles;
* ours bubble, planned layout: the same, planned on the model's measured costs
  (``python -m hp_recompute.costs --module bench/fsdp/net.py:build``, or
  ``examples/pipelining/model.py:build`` for the decoder, ``examples/llama/model.py:build``) with
  ``dp_shard=2``, so the plan unshards and reshards each stage and predicts each rank's
  peak with the gathered parameters (``peak_memory_bytes``), printed beside the measured.

The plans without a layout are made on a model JSON of made-up costs: uniform blocks
(``test_planned_schedule.model_json``) for net, ``examples/pipelining/decoder.model.json``
for the decoder; the Llama's are its measured costs without the layout. Every plan and torch's schedules split the model the same way: the blocks
evenly over the 4 stages, what precedes them on the first, what follows on the last.

Each run: a warm-up step (torch infers stage metadata; profiled too, so that the measured
step's frees of its blocks are seen: runner/memory.py), one step under the profiler's
allocator events (peak bytes above the step's start, gradients zeroed before it, per rank; the collectives FSDP
issues in it counted at ``torch.distributed``, summed over the ranks), then ``--steps``
timed steps (median; a barrier before each). The gradients of the measured step are
compared with the unsharded model's (mean over the dp ranks).

Usage: python bench/fsdp/bench_fsdp.py [--model {net,decoder,llama}] [--steps 5] [--repeats 2] [--batch 256]
    [--dim 256] [--layers 8]  (--dim and --layers: net only; the others' are their examples')
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Tuple

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
from harness import example_module, machine_line, median_step_ms, spawn, training_step  # noqa: E402
TESTS = REPO / "test" / "python" / "pipelining"
DECODER = REPO / "examples" / "pipelining" / "model.py"
LLAMA = REPO / "examples" / "llama" / "model.py"
MICROBATCHES, STAGES, PP, DP = 4, 4, 2, 2
BASELINE = "torch interleaved 1F1B + checkpoint"
VARIANTS = ["none", BASELINE, "torch ZBV + checkpoint", "ours jit", "ours bubble", "ours bubble, planned layout"]
PLANS = {"none": "none", "ours jit": "jit", "ours bubble": "bubble", "ours bubble, planned layout": "layout"}


class Model(NamedTuple):
    """What differs between the benched models; the rest of the bench is the same for both."""

    full: Callable[[Dict[str, Any]], torch.nn.Module]  # the whole model, seeded the same on every rank
    stage: Callable[[torch.nn.Module, List[str]], torch.nn.Module]  # a copy of it keeping these regions
    batch: Callable[[Dict[str, Any], int], List[torch.Tensor]]  # a dp rank's inputs and target
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    model_json: Callable[[Path, Dict[str, Any]], None]  # the made-up costs of the plans without a layout
    costs: Callable[[Dict[str, Any]], Tuple[List[str], Dict[str, str]]]  # hp_recompute.costs's arguments, env
    describe: Callable[[Dict[str, Any]], str]  # the model, in the table's first line


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def _net(cfg: Dict[str, Any]) -> torch.nn.Module:
    from pp_worker import Net

    torch.manual_seed(0)
    return Net(cfg["dim"], cfg["layers"], 0.0)


def _net_stage(full: torch.nn.Module, regions: List[str]) -> torch.nn.Module:
    from pp_worker import stage_module

    return stage_module(full, regions)


def _net_batch(cfg: Dict[str, Any], dp_rank: int) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(7 + dp_rank)
    return [torch.randn(cfg["batch"], cfg["dim"], generator=g) for _ in range(2)]


def _net_model_json(path: Path, cfg: Dict[str, Any]) -> None:
    from test_planned_schedule import model_json

    model_json(path, cfg["layers"])


def _net_costs(cfg: Dict[str, Any]) -> Tuple[List[str], Dict[str, str]]:
    return (["--module", f"{HERE / 'net.py'}:build", "--input-shape", f"{cfg['batch'] // MICROBATCHES}x{cfg['dim']}"],
            {"HPR_BENCH_NET": f"{cfg['dim']},{cfg['layers']}"})


def _decoder_module() -> Any:
    """examples/pipelining/model.py."""
    return example_module("hpr_pipelining_decoder", DECODER)


def _count_call(name: str, module: torch.nn.Module, args: Any) -> None:
    from pp_worker import CALLS

    CALLS[name] += 1  # as pp_worker's Block counts itself: forwards and replays


def _counting_blocks(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` (an example's, blocks in ``layers``) with each block's calls counted."""
    for name, block in model.layers.items():
        block.register_forward_pre_hook(functools.partial(_count_call, f"layers.{name}"))
    return model


def _decoder(cfg: Dict[str, Any]) -> torch.nn.Module:
    return _counting_blocks(_decoder_module().build())  # seeded


def _decoder_stage(full: torch.nn.Module, regions: List[str]) -> torch.nn.Module:
    return _decoder_module().stage_module(copy.deepcopy(full), regions)


def _decoder_batch(cfg: Dict[str, Any], dp_rank: int) -> List[torch.Tensor]:
    m = _decoder_module()
    g = torch.Generator().manual_seed(7 + dp_rank)
    tokens = torch.randint(0, m.VOCAB, (cfg["batch"], m.SEQ), generator=g)
    return [tokens, tokens.roll(-1, dims=1)]  # the next token, as examples/pipelining/train.py


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def _decoder_model_json(path: Path, cfg: Dict[str, Any]) -> None:
    shutil.copyfile(DECODER.parent / "decoder.model.json", path)


def _decoder_costs(cfg: Dict[str, Any]) -> Tuple[List[str], Dict[str, str]]:
    return (["--module", f"{DECODER}:build", "--input-shape", f"{cfg['batch'] // MICROBATCHES}x{_decoder_module().SEQ}",
             "--input-dtype", "int64"], {})


def _llama_module() -> Any:
    """examples/llama/model.py, imported once under its own name."""
    return example_module("hpr_llama_example", LLAMA)


def _llama(cfg: Dict[str, Any]) -> torch.nn.Module:
    return _counting_blocks(_llama_module().build())  # seeded


def _llama_stage(full: torch.nn.Module, regions: List[str]) -> torch.nn.Module:
    """The example's own stage module (torchtitan's): the stage is the one that owns these blocks."""
    blocks = [int(r.split(".")[1]) for r in regions if r.startswith("layers.")]
    return _llama_module().stage_module(full, blocks[0] // (len(full.layers) // STAGES), STAGES)


def _llama_batch(cfg: Dict[str, Any], dp_rank: int) -> List[torch.Tensor]:
    m = _llama_module()
    g = torch.Generator().manual_seed(7 + dp_rank)
    tokens = torch.randint(0, m.ModelArgs().vocab_size, (cfg["batch"], m.SEQ), generator=g)
    return [tokens, tokens]  # the example's loss predicts each next token of its input


def _llama_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return _llama_module()._loss(logits, tokens)


def _llama_costs(cfg: Dict[str, Any]) -> Tuple[List[str], Dict[str, str]]:
    return (["--module", f"{LLAMA}:build", "--input-shape", f"{cfg['batch'] // MICROBATCHES}x{_llama_module().SEQ}",
             "--input-dtype", "int64"], {})


def _llama_model_json(path: Path, cfg: Dict[str, Any]) -> None:
    """No made-up costs for the Llama: its plans without a layout use its measured costs too."""
    _measure(MODELS["llama"], cfg, path)


def _describe_llama(cfg: Dict[str, Any]) -> str:
    m = _llama_module()
    a = m.ModelArgs()
    return (f"the Llama of examples/llama/model.py ({a.n_layers} blocks of width {a.dim}, {a.n_heads} heads, "
            f"{a.n_kv_heads} kv heads, vocabulary {a.vocab_size}), sequences of {m.SEQ} tokens")


def _describe_net(cfg: Dict[str, Any]) -> str:
    return f"{cfg['layers']} blocks of width {cfg['dim']}"


def _describe_decoder(cfg: Dict[str, Any]) -> str:
    m = _decoder_module()
    return (f"the decoder of examples/pipelining/model.py ({m.LAYERS} blocks of width {m.DIM}, vocabulary {m.VOCAB}), "
            f"sequences of {m.SEQ} tokens")


MODELS = {"net": Model(_net, _net_stage, _net_batch, _mse, _net_model_json, _net_costs, _describe_net),
          "decoder": Model(_decoder, _decoder_stage, _decoder_batch, _cross_entropy, _decoder_model_json,
                           _decoder_costs, _describe_decoder),
          "llama": Model(_llama, _llama_stage, _llama_batch, _llama_loss, _llama_model_json, _llama_costs,
                         _describe_llama)}


def stage_spec(names: List[str]) -> str:
    """The plans' ``stages``: the blocks (``layers.N``) evenly over the stages, the regions
    before them on the first stage, those after them on the last (net's head; the decoder's
    embeddings and norm+output)."""
    blocks = [i for i, name in enumerate(names) if name.startswith("layers.")]
    per = len(blocks) // STAGES
    starts = [0] + [blocks[s * per] for s in range(1, STAGES)]
    ends = [start - 1 for start in starts[1:]] + [len(names) - 1]
    return ",".join(f"{s}:{start}-{end}" for s, (start, end) in enumerate(zip(starts, ends)))


def _one(rank: int, cfg: Dict[str, Any], variant: str, reshard: bool, mesh: Any, ref: Dict[str, Any]) -> Dict[str, Any]:
    from fsdp_worker import counted_collectives
    from pp_worker import CALLS, stages_of_rank
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as torch_wrapper
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, ScheduleZBVZeroBubble

    import hp_recompute as hr
    from hp_recompute.pipelining import PlannedSchedule
    from hp_recompute.runner.memory import AllocatorPeak

    model = MODELS[cfg["model"]]
    dp_mesh, pp_rank = mesh["dp"], mesh.get_local_rank("pp")
    full = model.full(cfg)
    wrap = {"none": None, "torch ZBV + checkpoint": torch_wrapper, BASELINE: torch_wrapper}.get(
        variant, hr.checkpoint_wrapper)
    placement = "i1f1b" if variant == BASELINE else "zbv"
    stages = []
    for s in stages_of_rank({"ranks": PP, "stages": STAGES, "torch_schedule": placement}, pp_rank):
        module = model.stage(full, cfg["split"][s])
        for key in list(module.layers.keys()):
            if wrap is not None:
                module.layers[key] = wrap(module.layers[key])
            fully_shard(module.layers[key], mesh=dp_mesh, reshard_after_forward=reshard)
        fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard)
        stages.append(PipelineStage(module, s, STAGES, torch.device("cpu"), group=mesh.get_group("pp")))
    if variant == "torch ZBV + checkpoint":
        schedule = ScheduleZBVZeroBubble(stages, MICROBATCHES, loss_fn=model.loss)
    elif variant == BASELINE:
        schedule = ScheduleInterleaved1F1B(stages, MICROBATCHES, loss_fn=model.loss)
    else:
        plan = cfg["plans"][PLANS[variant]]
        schedule = PlannedSchedule(stages, MICROBATCHES, loss_fn=model.loss, plan=plan)
    x, y = model.batch(cfg, mesh.get_local_rank("dp"))
    step = training_step(schedule, stages, x, y)

    with AllocatorPeak():  # warm-up (torch infers the stages' metadata), profiled so that the measured
        step()  # step's frees of its blocks are seen (runner/memory.py: a block allocated unprofiled)
    CALLS.clear()
    for st in stages:  # as the plan counts: from a step that holds no gradients (the step's own zero_grad
        st.submod.zero_grad(set_to_none=True)  # would free the last step's sharded ones under the meter)
    with AllocatorPeak() as meter, counted_collectives() as collectives:
        step()
    calls = max(CALLS.values()) / MICROBATCHES if CALLS else 0.0
    grads_ok = True
    for st in stages:
        for name, p in st.submod.named_parameters():
            want = ref[name.replace("_checkpoint_wrapped_module.", "")]
            if p.grad is None or not torch.allclose(p.grad.full_tensor(), want, rtol=1e-5, atol=1e-6):
                grads_ok = False
    ms = median_step_ms(step, cfg["steps"])
    return {"ms": ms, "peak": meter.peak, "calls": calls, "grads_ok": grads_ok, "collectives": dict(collectives)}


def body(rank: int, cfg: Dict[str, Any]) -> Dict[str, Any]:
    sys.path[:0] = [str(TESTS), str(TESTS.parent / "fsdp"), str(TESTS.parent)]  # pp_worker, fsdp_worker, their helpers
    from torch.distributed.device_mesh import init_device_mesh

    model = MODELS[cfg["model"]]
    mesh = init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp"))
    reference = copy.deepcopy(model.full(cfg))
    for d in range(DP):
        xd, yd = model.batch(cfg, d)
        (model.loss(reference(xd), yd) / DP).backward()
    ref = {n: p.grad for n, p in reference.named_parameters()}
    rows = []
    for repeat in range(cfg["repeats"]):
        for reshard in (True, False):
            for variant in VARIANTS:
                row = _one(rank, cfg, variant, reshard, mesh, ref)
                rows.append({"repeat": repeat, "reshard": reshard, "variant": variant, **row})
    return {"rows": rows}


def _measure(model: Model, cfg: Dict[str, Any], out: Path) -> None:
    """The model JSON of ``model``'s measured costs (``python -m hp_recompute.costs --module``)."""
    arguments, env = model.costs(cfg)
    subprocess.run([sys.executable, "-m", "hp_recompute.costs", *arguments, "-o", str(out)],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, **env})


def _plans(model: Model, cfg: Dict[str, Any], work: Path) -> Tuple[Dict[str, str], List[int], Dict[int, List[str]]]:
    """The four plans (paths), the planned-layout plan's peaks per rank, and the stages' regions."""
    from hp_recompute import make_plan

    model.model_json(work / "model.json", cfg)
    _measure(model, cfg, work / "costed.json")
    names = [[r["name"] for r in json.loads((work / f).read_text())["regions"]] for f in ("model.json", "costed.json")]
    if names[0] != names[1]:
        sys.exit(f"the measured model's regions {names[1]} are not the model JSON's {names[0]}")
    spec = stage_spec(names[0])
    plans, layout_peaks = {}, []
    for name, options in {"none": {"checkpoint": "none"}, "jit": {}, "bubble": {"prefetch": "bubble"},
                          "layout": {"prefetch": "bubble", "dp_shard": DP}}.items():
        source = work / ("costed.json" if name == "layout" else "model.json")
        plan = make_plan(schedule_gen="zbv", model=source, ranks=PP, microbatches=MICROBATCHES, stages=spec,
                         **options)
        if name == "layout":
            layout_peaks = plan["summary"]["peak_memory_bytes"]
        path = work / f"{name}.json"
        path.write_text(json.dumps(plan))
        plans[name] = str(path)
    split = {s: [r["name"] for r in stage["regions"]] for s, stage in enumerate(plan["model"]["stages"])}
    return plans, layout_peaks, split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="net",
                        help="net: pp_worker's residual MLP (default); decoder: examples/pipelining/model.py; "
                        "llama: examples/llama/model.py")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dim", type=int, default=None, help="net's width (default 256)")
    parser.add_argument("--layers", type=int, default=None, help="net's blocks (default 8)")
    parser.add_argument("--batch", type=int, default=256, help="samples (decoder: sequences) per dp rank and step")
    args = parser.parse_args()
    if args.model != "net" and (args.dim, args.layers) != (None, None):
        parser.error(f"--dim and --layers size net; the {args.model}'s are its example's (its build())")
    sys.path[:0] = [str(REPO / "python"), str(TESTS), str(TESTS.parent)]  # test_planned_schedule, rank_processes
    model = MODELS[args.model]
    cfg = {"model": args.model, "steps": args.steps, "repeats": args.repeats, "dim": args.dim or 256,
           "layers": args.layers or 8, "batch": args.batch}

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plans, layout_peaks, split = _plans(model, cfg, work)
        results = spawn(body, {**cfg, "plans": plans, "split": split}, PP * DP, work)
    print(f"PP {PP} x FSDP2 {DP} (gloo, 4 processes, 1 thread each), ZBV, {STAGES} stages, {MICROBATCHES} "
          f"microbatches, {model.describe(cfg)}, batch {args.batch} per dp rank; "
          f"step ms = median of {args.steps} steps, slowest rank; all-gathers and reduce-scatters in one step, "
          f"all ranks; peak = allocator bytes above the step's start (pp rank 0, 1; dp rank 0)")
    print(machine_line())
    print("| reshard_after_forward | run | variant | step ms | vs torch interleaved 1F1B | all-gathers | "
          "reduce-scatters | block calls / microbatch | peak bytes pp 0, 1 | measured / planned peak pp 0, 1 | "
          "gradients = unsharded |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |")
    rows = results[0]["rows"]
    for i, row in enumerate(rows):
        ms = max(res["rows"][i]["ms"] for res in results)
        base = next(r for r in rows if r["repeat"] == row["repeat"] and r["reshard"] == row["reshard"]
                    and r["variant"] == BASELINE)
        base_ms = max(res["rows"][rows.index(base)]["ms"] for res in results)
        gathers, scatters = (sum(res["rows"][i]["collectives"].get(kind, 0) for res in results)
                             for kind in ("all_gather", "reduce_scatter"))
        measured = [results[0]["rows"][i]["peak"], results[DP]["rows"][i]["peak"]]  # pp ranks 0 and 1, dp 0
        peaks = f"{measured[0]}, {measured[1]}"
        ratio = (", ".join(f"{m / p:.2f}" for m, p in zip(measured, layout_peaks))
                 if PLANS.get(row["variant"]) == "layout" else "-")
        ok = all(res["rows"][i]["grads_ok"] for res in results)
        calls = max(res["rows"][i]["calls"] for res in results)
        print(f"| {row['reshard']} | {row['repeat'] + 1} | {row['variant']} | {ms:.1f} | {ms / base_ms:.2f} | "
              f"{gathers} | {scatters} | {calls:g} | {peaks} | {ratio} | {'yes' if ok else 'NO'} |")


if __name__ == "__main__":
    main()
