"""Models for the runner: regions in execution order, and their split into plan stages.

Why: a plan names regions (``tok_emb``, ``blocks.3``, ``ln_f+head``, docs/models.md), not
Python code. The runner needs, per region, a function ``fn(x, batch) -> y`` and the
parameters it owns, so that a stage is "its regions in order" and each plan region with
``checkpoint: true`` can be wrapped in ``hp_recompute.checkpoint``. Which regions each stage
runs is the planner's choice (the plan's ``model.stages``, docs/models.md "Partition"); the
runner has no partition rule of its own, so a plan of the CLI's uniform model is refused.

A model is a ``PipelineModel``. ``--model FILE.py:FACTORY`` returns one (any architecture;
the bundled examples' ``model.py:pipeline``), or a transformers causal LM of a family
``hp_recompute.hf`` supports, whose regions the adapter below names as the costs tool does.
The first region receives the microbatch as ``x``; the last one returns the scalar loss.
``load_model(spec, device)`` puts the module and every batch on ``device`` (``--device``,
single-process runs).
"""

from __future__ import annotations

import glob
import json
import os
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import RunError
from ..factory import call_factory
from ..hf import causal_lm_regions, layout_of
from ..plan.reader import Plan, region_checkpoint
from ..replay_state import device_module
from ..selective import hidden_compiled_modules, selective_context_fn

__all__ = ["Region", "PipelineModel", "Unit", "StageSpec", "load_model", "adapt", "split_stages",
           "parameters_under", "DEFAULT_MODEL", "DEFAULT_FACTORY", "region_seed"]


def _examples_dir() -> str:
    """The bundled examples: package data of an installed hp_recompute, else the checkout's ``examples/``."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    installed = os.path.join(package, "examples")
    return installed if os.path.isdir(installed) else os.path.join(os.path.dirname(os.path.dirname(package)),
                                                                   "examples")


DEFAULT_MODEL = os.path.join(_examples_dir(), "gpt", "model.py")
#: The factory ``--model`` defaults to, in DEFAULT_MODEL.
DEFAULT_FACTORY = "pipeline"

RegionFn = Callable[[Any, Any], Any]


@dataclass
class Region:
    """One model region: ``fn(x, batch)`` and the names of the parameters it owns."""

    name: str
    fn: RegionFn
    params: List[str]
    checkpointable: bool = True


@dataclass
class PipelineModel:
    """What the runner needs from a model.

    Attributes:
        name: printed in the report.
        module: owns every parameter (``named_parameters`` names are the report's keys).
        regions: in execution order; together they compute ``reference_loss``.
        make_batch: ``make_batch(generator) -> batch`` (one microbatch, deterministic).
        reference_loss: ``reference_loss(batch) -> loss``: the module's own forward, e.g.
            ``module(batch)``; the runner checks once, in eval mode, that the regions in
            order compute the same loss (``reference.check_regions``).
    """

    name: str
    module: nn.Module
    regions: List[Region]
    make_batch: Callable[[torch.Generator], Any]
    reference_loss: Callable[[Any], torch.Tensor]


def parameters_under(module: nn.Module, *prefixes: str) -> List[str]:
    """The names of ``module``'s parameters at or under the module paths ``prefixes`` (a
    region's ``params``)."""
    names = [n for n, _ in module.named_parameters()]
    return [n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes)]


#: The microbatch of input ids a Hugging Face causal LM trains on by default: 2 sequences of
#: 64 tokens (at most the model's positions). ``--input-shape`` chooses another.
HF_INPUT_SHAPE = (2, 64)


def _lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of ``logits`` on ``ids``, in float32 (as transformers' own)."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))


def _adapt_hf(m: nn.Module, input_shape: Optional[Sequence[int]]) -> PipelineModel:
    """A transformers causal LM of a family in ``hp_recompute.hf.LAYOUTS``: its regions as
    ``python -m hp_recompute.costs --module`` names them (``hf.causal_lm_regions``), random
    input ids of ``input_shape``, and the next-token loss of its logits."""
    regions = causal_lm_regions(m, "hp_recompute.run: --model")
    config = m.config
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    shape = tuple(input_shape) if input_shape else (HF_INPUT_SHAPE[0], min(HF_INPUT_SHAPE[1], positions or 64))
    if len(shape) != 2 or (positions and shape[1] > positions):
        raise RunError(f"hp_recompute.run: --input-shape: {type(m).__name__} takes input ids of shape "
                       f"BATCHxSEQUENCE, SEQUENCE at most {positions}; got {'x'.join(map(str, shape))}")
    vocab = config.vocab_size

    def run(region: Any) -> RegionFn:
        return lambda x, batch: region.module(x)

    def head(region: Any) -> RegionFn:
        return lambda x, ids: _lm_loss(region.module(x), ids)

    fns = [run(r) for r in regions[:-1]] + [head(regions[-1])]
    pipeline = [Region(r.name, fn, r.params, 0 < i < len(regions) - 1) for i, (r, fn) in enumerate(zip(regions, fns))]
    return PipelineModel(type(m).__name__, m, pipeline, lambda g: torch.randint(0, vocab, shape, generator=g),
                         lambda ids: _lm_loss(m(input_ids=ids, use_cache=False).logits, ids))


def adapt(obj: Any, input_shape: Optional[Sequence[int]] = None) -> PipelineModel:
    """Returns ``obj`` as a ``PipelineModel`` (itself, or through a structural adapter).

    ``input_shape`` (``--input-shape``): the microbatch of a Hugging Face causal LM; refused
    for another model, whose adapter or factory draws its own batches."""
    if input_shape is not None and layout_of(obj) is None:
        what = f"model '{obj.name}'" if isinstance(obj, PipelineModel) else type(obj).__name__
        raise RunError(f"hp_recompute.run: --input-shape: only a Hugging Face causal LM's input ids take a shape "
                       f"from the command line; {what} draws its own batches (make_batch)")
    if isinstance(obj, PipelineModel):
        return obj
    if layout_of(obj) is not None:
        return _adapt_hf(obj, input_shape)
    raise RunError(f"hp_recompute.run: --model: no pipeline adapter for {type(obj).__name__}; return a "
                   f"hp_recompute.runner.model.PipelineModel from the factory, as the bundled examples' "
                   f"model.py:pipeline do (docs/runner.md)")


def _on(device: torch.device, value: Any) -> Any:
    """``value`` with every tensor in it (tuples, lists, dicts) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_on(device, v) for v in value)
    if isinstance(value, dict):
        return {k: _on(device, v) for k, v in value.items()}
    return value


def load_model(spec: Optional[str], device: Optional[torch.device] = None,
               input_shape: Optional[Sequence[int]] = None) -> PipelineModel:
    """Builds the model of ``FILE.py:FACTORY`` (default: the bundled GPT's ``pipeline``);
    ``input_shape`` as ``adapt`` takes it.

    With ``device`` (not the CPU), the module is moved there and ``make_batch`` puts each
    microbatch there; batches are still drawn from a CPU generator, so they are the same
    on every device.
    """
    spec = spec or os.path.normpath(DEFAULT_MODEL) + ":" + DEFAULT_FACTORY
    model = adapt(call_factory(spec, "hp_recompute.run: --model", RunError), input_shape)
    if device is not None and torch.device(device).type != "cpu":
        target = torch.device(device)
        model.module.to(target)
        make = model.make_batch
        model.make_batch = lambda g: _on(target, make(g))
    return model


def _device_of(x: Any) -> Optional[torch.device]:
    """The device of ``x`` (or of the first tensor of a tuple/list batch) when it is not the CPU."""
    if isinstance(x, (tuple, list)):
        x = next((v for v in x if isinstance(v, torch.Tensor)), None)
    if isinstance(x, torch.Tensor) and x.device.type != "cpu":
        return x.device
    return None


def _seed_device(device: torch.device, seed: int) -> None:
    """Seeds the generator of ``device`` only (its device module, under its device context)."""
    module = device_module(device.type)
    with module.device(device):
        module.manual_seed(seed)


def region_seed(microbatch_seed: int, name: str) -> int:
    """The RNG seed of region ``name`` for one microbatch (stable across processes)."""
    return (microbatch_seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 63)


@dataclass
class Unit:
    """Model regions run as one call, checkpointed or not: a plan region (one model region), or
    the reference step's chain of every region."""

    name: str
    checkpoint: bool
    regions: List[Region]
    #: The ``context_fn`` of a selective checkpoint (plan ``"checkpoint": "selective"``); None otherwise.
    context_fn: Optional[Callable[[], Any]] = None

    def __call__(self, x: Any, batch: Any, seed: Optional[int] = None) -> Any:
        """Runs the regions in order; with ``seed``, each region draws from its own RNG stream.

        Why per region: the pipeline runs microbatches and replays in another order than a
        plain step, so one global stream would give dropout other masks in each. Seeding
        every region from (microbatch seed, region name) makes the masks a function of
        the region and the microbatch only, in the pipeline, in its replays (the replay
        seeds again) and in the reference step alike. The CPU generator is seeded, and
        the generator of the device ``x`` is on when that is not the CPU (``--device``);
        never through ``torch.manual_seed``, which visits every device's generator and
        costs 100x more.
        """
        for region in self.regions:
            if seed is not None:
                torch.default_generator.manual_seed(region_seed(seed, region.name))
                device = _device_of(x)
                if device is not None:
                    _seed_device(device, region_seed(seed, region.name))
            x = region.fn(x, batch)
        return x


@dataclass
class StageSpec:
    """A stage: its units in order and the names of the parameters it owns."""

    stage: int
    units: List[Unit]
    params: List[str] = field(default_factory=list)


def _by_name(plan: Plan, model: PipelineModel) -> List[StageSpec]:
    wrapped = [name for name, sub in model.module.named_modules() if hasattr(sub, "_checkpoint_wrapped_module")]
    if wrapped:  # the runner checkpoints the plan's regions itself; a wrapper would replay on its own
        raise RunError(f"hp_recompute.run: model '{model.name}' holds checkpoint wrappers "
                       f"({', '.join(repr(w) for w in wrapped)}), which would replay where {plan.path} places no "
                       f"replay; the runner checkpoints each region as the plan says: build the model without them")
    index = {r.name: r for r in model.regions}
    policy = None  # the selective policy of the plan's selective regions, made (and checked) once
    flat = []
    specs = []
    for s, regions in enumerate(plan.stages):
        units = []
        for j, pr in enumerate(regions):
            region = index.get(pr["name"])
            if region is None and plan.raw["model"].get("name") == "uniform":
                raise _refuse_uniform(plan, model, s, j)
            if region is None:
                raise RunError(f"hp_recompute.run: {plan.path}: /model/stages/{s}/regions/{j}/name: region "
                               f"'{pr['name']}' is not in model '{model.name}' (regions: "
                               f"{', '.join(index)})")
            if pr.get("checkpoint", False) and not region.checkpointable:
                raise RunError(f"hp_recompute.run: {plan.path}: /model/stages/{s}/regions/{j}/checkpoint: "
                               f"region '{region.name}' is not checkpointable")
            selective = region_checkpoint(pr) == "selective"
            hidden = []
            if selective and policy is None:
                policy = selective_context_fn()
                hidden = hidden_compiled_modules(model.module, policy)
            if hidden:  # the runner's regions are functions: any compiled module of the model may be in one
                raise RunError(f"hp_recompute.run: {plan.path}: /model/stages/{s}/regions/{j}/checkpoint: region "
                               f"'{region.name}' is \"selective\", but model '{model.name}' holds compiled "
                               f"modules ({', '.join(repr(h) for h in hidden)}) whose ops the policy cannot see; "
                               f"do not compile the model for the runner, or plan the region in full "
                               f"[hpr.selective.visible-ops]")
            units.append(Unit(region.name, bool(pr.get("checkpoint", False)), [region],
                              policy if selective else None))
            flat.append(region.name)
        specs.append(StageSpec(s, units))
    expected = [r.name for r in model.regions]
    if flat != expected:
        raise RunError(f"hp_recompute.run: {plan.path}: /model/stages: the plan's regions "
                       f"[{', '.join(flat)}] do not cover model '{model.name}' in order "
                       f"[{', '.join(expected)}]; plan this model (hp-recompute-plan --model ...)")
    return specs


def _bundled_model_json(model: PipelineModel) -> Optional[str]:
    """The bundled example's model JSON that describes ``model`` (same name, same regions in
    order), e.g. ``examples/gpt/gpt.model.json`` for the default GPT; None for any other model."""
    names = [r.name for r in model.regions]
    for path in sorted(glob.glob(os.path.join(_examples_dir(), "*", "*.model.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                graph = json.load(f)
            if graph.get("name") == model.name and [r.get("name") for r in graph.get("regions", [])] == names:
                return path
        except (OSError, ValueError, AttributeError):
            continue
    return None


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it lies under it (as a user would type it)."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


def _refuse_uniform(plan: Plan, model: PipelineModel, s: int, j: int) -> RunError:
    """The error for a plan of the CLI's uniform model (regions ``stage0``...), located at its
    region ``/model/stages/S/regions/J``.

    Why refused: the uniform model has one made-up region per stage, so the plan does not say
    which of the model's regions each stage runs; that partition is the planner's (the balanced
    or explicit split of docs/models.md, "Partition"), and the runner never makes up another."""
    json_path = _bundled_model_json(model)
    fix = (f"plan the model: hp-recompute-plan --model {_shown(json_path) if json_path else 'MODEL.json'} and this "
           f"plan's schedule flags")
    if json_path is None:
        fix += (f", MODEL.json being model '{model.name}''s JSON graph with its regions "
                f"[{', '.join(r.name for r in model.regions)}] (docs/models.md; python -m hp_recompute.export "
                f"--model-json writes one for an nn.Module)")
    return RunError(f"hp_recompute.run: {plan.path}: /model/stages/{s}/regions/{j}/name: region "
                    f"'{plan.stages[s][j]['name']}' is the uniform model's (planned without --model), which does "
                    f"not say which of model '{model.name}''s regions each stage runs; {fix}")


def split_stages(plan: Plan, model: PipelineModel) -> List[StageSpec]:
    """The model's stages as the plan names them: each plan region is the model's region of
    that name, in the partition the planner chose.

    A plan of the CLI's uniform model (``/model/name`` ``uniform``) whose regions are not the
    model's is refused, located at its first such region: the runner has no partition of its
    own."""
    specs = _by_name(plan, model)
    for spec in specs:
        seen: List[str] = []
        for unit in spec.units:
            for region in unit.regions:
                seen.extend(p for p in region.params if p not in seen)
        spec.params = seen
    return specs


def stage_names(specs: Sequence[StageSpec]) -> Dict[int, List[str]]:
    """stage -> names of the model regions it runs (for the report)."""
    return {s.stage: [r.name for u in s.units for r in u.regions] for s in specs}
