"""Hugging Face transformers models under hp_recompute: checkpointing and pipeline stages.

``enable_checkpointing(model)`` turns on a ``PreTrainedModel``'s own gradient
checkpointing (one checkpoint per decoder layer, caches off inside it) with
``hp_recompute.checkpoint`` as its checkpoint function: outside a recompute session it
trains exactly as HF's own (torch's non-reentrant checkpoint), inside one each layer is a
region the session replays once.

``stage_module(model, plan, stage)`` returns one pipeline stage of a decoder-only causal
LM for torch's ``PipelineStage``: the plan's decoder layers of that stage under the full
model's names (``model.layers.5.mlp.up_proj.weight``), ``input_ids`` in on the first stage
and hidden states after, logits out of the last; position ids, rotary embeddings and the
causal mask are the model's own, computed on every stage as the whole model computes them.
The stage shares the model's parameters (no copy), so gradients land in ``model``.

Supported layouts (``LAYOUTS``): Llama, Mistral, Qwen2, Qwen3, Phi3 (``model.layers``)
and GPT-2 (``transformer.h``). docs/huggingface.md walks through both calls.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .checkpoint import checkpoint
from .errors import RunError
from .plan.reader import Plan

__all__ = ["LAYOUTS", "DecoderLayout", "DecoderStage", "CausalLMRegion", "causal_lm_regions", "enable_checkpointing",
           "hf_checkpointing_on", "layout_of", "stage_module"]


def _is_pretrained(model: Any) -> bool:
    return any(cls.__name__ == "PreTrainedModel" and cls.__module__.startswith("transformers")
               for cls in type(model).__mro__)


def hf_checkpointing_on(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers layer whose own gradient checkpointing is on (its
    ``forward`` then checkpoints itself through ``_gradient_checkpointing_func``)."""
    return getattr(module, "gradient_checkpointing", False) is True and hasattr(module, "_gradient_checkpointing_func")


def enable_checkpointing(model: nn.Module, every_n_layers: int = 1) -> nn.Module:
    """Turns on ``model``'s gradient checkpointing through ``hp_recompute.checkpoint``.

    What HF's ``activation_checkpointing_enable()`` (``gradient_checkpointing_enable()``
    before transformers 5) does, with the checkpoint function replaced: each decoder layer
    (every ``every_n_layers``-th) runs under ``hp_recompute.checkpoint(...,
    use_reentrant=False)``, HF turns caches off inside it, and the input embeddings get
    ``requires_grad`` as HF sets them. Returns ``model``.

    Raises ``RunError`` if ``model`` is not a transformers ``PreTrainedModel`` that supports
    gradient checkpointing.
    """
    if not _is_pretrained(model):
        raise RunError(f"hp_recompute.hf.enable_checkpointing: expected a transformers PreTrainedModel, got "
                       f"{type(model).__name__}; wrap other modules' blocks with hp_recompute.checkpoint_wrapper")
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise RunError(f"hp_recompute.hf.enable_checkpointing: {type(model).__name__} does not support gradient "
                       f"checkpointing (transformers says so: supports_gradient_checkpointing is False)")
    if not isinstance(every_n_layers, int) or isinstance(every_n_layers, bool) or every_n_layers < 1:
        raise RunError(f"hp_recompute.hf.enable_checkpointing: every_n_layers must be an integer >= 1, got "
                       f"{every_n_layers!r}")
    options = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options, every_n_layers=every_n_layers)
    elif every_n_layers == 1:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
    else:
        raise RunError("hp_recompute.hf.enable_checkpointing: every_n_layers needs transformers >= 5")
    # HF keeps the function it checkpoints with on every module that checkpoints (a private
    # attribute, the one its own enable call sets): ours, with HF's options.
    ours = functools.partial(checkpoint, **options)
    for module in model.modules():
        if hasattr(module, "_gradient_checkpointing_func"):
            module._gradient_checkpointing_func = ours
    return model


# ---------------------------------------------------------------------------
# Pipeline stages
# ---------------------------------------------------------------------------


class _NoPositions(nn.Module):
    """Stands in for an absolute position embedding on a stage past the first, whose input
    already carries it: a zero that adds nothing (0-dim, so it keeps the input's dtype)."""

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros((), device=position_ids.device)


@dataclass(frozen=True)
class DecoderLayout:
    """Where a decoder-only causal LM family keeps its parts.

    ``base``: the base model's attribute on the causal LM (``model``); ``layers``: the
    ``ModuleList`` of decoder layers in it; ``head``: the LM head on the causal LM;
    ``embedding``: the token embedding in the base model; ``final_norm``: the base model's
    norm after its layers (the last stage's only); ``input_side``: the base model's
    modules its forward applies to the embeddings before the layers even when given
    ``inputs_embeds`` (GPT-2's position embedding and dropout), which a stage past the first
    replaces, since its input has been through them already."""

    base: str
    layers: str
    embedding: str
    final_norm: str
    head: str = "lm_head"
    input_side: Tuple[str, ...] = field(default_factory=tuple)


_MODEL_LAYERS = DecoderLayout(base="model", layers="layers", embedding="embed_tokens", final_norm="norm")

#: transformers ``model_type`` -> layout (``stage_module`` refuses other families).
LAYOUTS: Dict[str, DecoderLayout] = {
    "llama": _MODEL_LAYERS,
    "mistral": _MODEL_LAYERS,
    "qwen2": _MODEL_LAYERS,
    "qwen3": _MODEL_LAYERS,
    "phi3": _MODEL_LAYERS,
    "gpt2": DecoderLayout(base="transformer", layers="h", embedding="wte", final_norm="ln_f",
                          input_side=("wpe", "drop")),
}


def _shell(module: nn.Module, children: Dict[str, Optional[nn.Module]]) -> nn.Module:
    """A copy of ``module`` with its own child table ``children`` that shares its parameters,
    buffers and attributes; its hook tables are its own (FSDP or a user may hook the stage
    without touching the whole model)."""
    shell = copy.copy(module)
    for name, value in module.__dict__.items():
        if isinstance(value, dict):
            setattr(shell, name, type(value)(value))  # nn.Module's tables (OrderedDicts)
    shell._modules = type(module._modules)(children)
    return shell


def _stage_config(config: Any, kept: Sequence[int]) -> Any:
    """The base model's config for a stage holding layers ``kept``: its layer count, and its
    per-layer lists (``layer_types``: Qwen's sliding-window layers) cut to those layers, since
    the base model's forward enumerates its layers from 0."""
    config = copy.copy(config)
    types = getattr(config, "layer_types", None)
    if isinstance(types, (list, tuple)):
        config.layer_types = [types[i] for i in kept]
    config.num_hidden_layers = len(kept)
    return config


class DecoderStage(nn.Module):
    """One pipeline stage of a decoder-only causal LM: its parameters under the full model's
    names, the model's own base forward over its layers.

    ``forward(x)``: ``x`` is ``input_ids`` on the first stage, hidden states after; returns
    logits on the last stage, hidden states before it. Caches are off (``use_cache=False``);
    the mask is the causal one (keyword inputs such as an ``attention_mask`` are refused:
    they would not reach the later stages).
    """

    def __init__(self, model: nn.Module, layout: DecoderLayout, layers: Sequence[int], first: bool, last: bool) -> None:
        super().__init__()
        self.layout, self.layer_ids, self.is_first, self.is_last = layout, tuple(layers), first, last
        base = getattr(model, layout.base)
        blocks = getattr(base, layout.layers)
        kept = nn.ModuleList()
        for i in layers:  # the full model's indices, so the names stay ``layers.5``
            kept.add_module(str(i), blocks[i])
        children: Dict[str, Optional[nn.Module]] = {}
        for name, child in base.named_children():
            if name == layout.layers:
                children[name] = kept
            elif name == layout.embedding:
                children[name] = child if first else None
            elif name in layout.input_side and not first:
                children[name] = _NoPositions() if isinstance(child, nn.Embedding) else nn.Identity()
            elif name == layout.final_norm and not last:
                children[name] = nn.Identity()
            else:
                children[name] = child
        shell = _shell(base, children)
        shell.config = _stage_config(base.config, layers)
        self.add_module(layout.base, shell)
        if last:
            self.add_module(layout.head, getattr(model, layout.head))

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if kwargs:  # the stage carries one tensor between stages: nothing would reach the later ones
            raise RunError(f"hp_recompute.hf: a stage takes {'input ids' if self.is_first else 'hidden states'} "
                           f"only, got {', '.join(sorted(kwargs))}: keyword inputs such as an attention_mask are "
                           f"not carried between stages (each stage computes the causal mask itself); train on "
                           f"unpadded (packed) sequences")
        base = getattr(self, self.layout.base)
        inputs = {"input_ids": x} if self.is_first else {"inputs_embeds": x}
        hidden = base(**inputs, use_cache=False)[0]
        return getattr(self, self.layout.head)(hidden) if self.is_last else hidden


def layout_of(model: Any) -> Optional[DecoderLayout]:
    """The layout of ``model``, a transformers causal LM of a family in ``LAYOUTS``; else None."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    layout = LAYOUTS.get(model_type) if isinstance(model_type, str) else None
    if layout is None or not isinstance(getattr(model, layout.base, None), nn.Module) \
            or not isinstance(getattr(model, layout.head, None), nn.Module):
        return None
    return layout


def _layout_of(model: nn.Module, who: str) -> DecoderLayout:
    layout = layout_of(model)
    if layout is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        raise RunError(f"{who}: {type(model).__name__} (model_type {model_type!r}) is not a "
                       f"causal LM of a supported family ({', '.join(sorted(LAYOUTS))}: their *ForCausalLM "
                       f"classes); build the stage modules by hand (docs/pipelining.md)")
    return layout


def _stage_layers(plan: Any, stage: int, prefix: str, count: int) -> List[int]:
    """The decoder layer indices of ``stage``'s regions in ``plan`` (a region inside a layer,
    from a finer --region-depth, counts for its layer)."""
    found: List[int] = []
    for region in plan.stages[stage]:
        name = region["name"]
        if not name.startswith(prefix + "."):
            continue
        head = name[len(prefix) + 1:].split(".", 1)[0]
        if not head.isdigit() or int(head) >= count:
            raise RunError(f"hp_recompute.hf.stage_module: {plan.path}: stage {stage}'s region '{name}' is no "
                           f"decoder layer of this model ({count} layers under '{prefix}'); plan the model's "
                           f"costs (python -m hp_recompute.costs --module) again")
        if int(head) not in found:
            found.append(int(head))
    return found


def _check_tied(stages: List[DecoderStage], plan: Any) -> None:
    """Refuses a parameter two stages on different ranks share (GPT-2's tied embedding and
    head): each rank would hold its own copy and its own part of the gradient."""
    owners: Dict[int, Tuple[int, str]] = {}
    for index, stage in enumerate(stages):
        for name, p in stage.named_parameters():
            first = owners.setdefault(id(p), (index, name))
            if first[0] != index and plan.stage_to_rank[first[0]] != plan.stage_to_rank[index]:
                raise RunError(f"hp_recompute.hf.stage_module: '{name}' of stage {index} is '{first[1]}' of stage "
                               f"{first[0]} (tied weights), on ranks {plan.stage_to_rank[first[0]]} and "
                               f"{plan.stage_to_rank[index]}, so each rank would train its own copy with part of "
                               f"the gradient; untie them (config.tie_word_embeddings=False) or plan a V-shaped "
                               f"schedule (zbv, dualpipev), which puts the first and the last stage on one rank")


def _refuse_hf_checkpointing(model: nn.Module, who: str, fix: str) -> None:
    """Refuses ``model`` when a module in it has HF's own gradient checkpointing on: the plan
    checkpoints the layers itself, and the two would nest."""
    on = [name for name, m in model.named_modules() if hf_checkpointing_on(m)]
    if on:
        raise RunError(f"{who}: Hugging Face's gradient checkpointing is on in '{on[0]}'"
                       f"{f' and {len(on) - 1} more' if len(on) > 1 else ''}; the plan checkpoints the layers itself "
                       f"(the two would nest): {fix}")


@dataclass
class CausalLMRegion:
    """A region of a causal LM as ``python -m hp_recompute.costs --module`` names it (its
    default ``--region-depth 1``): ``module(x)`` maps the region's input to its output."""

    name: str
    module: DecoderStage
    params: List[str]


def causal_lm_regions(model: nn.Module, who: str) -> List[CausalLMRegion]:
    """The regions of the transformers causal LM ``model`` in order, as the costs tool names
    them: ``model`` (input ids to embeddings), ``model.layers.N`` (one decoder layer each),
    ``model+lm_head`` (the final norm and the head, to logits); GPT-2's ``transformer``,
    ``transformer.h.N``, ``transformer+lm_head``. Each is a stage module of that part
    (``DecoderStage``), so positions, rotary embeddings and the causal mask are the model's
    own. ``who`` starts the messages.

    Raises ``RunError`` for a model of another family, one with HF's own checkpointing on,
    and tied weights (``tie_word_embeddings``: the embedding and the head in two regions,
    which the runner may place on two ranks)."""
    layout = _layout_of(model, who)
    _refuse_hf_checkpointing(model, who, "build the model without it (no activation_checkpointing_enable() or "
                                         "gradient_checkpointing_enable())")
    base = getattr(model, layout.base)
    count = len(getattr(base, layout.layers))
    named = dict(model.named_parameters())
    shared = [name for name, _ in model.named_parameters(remove_duplicate=False) if name not in named]
    if shared:
        raise RunError(f"{who}: '{shared[0]}' is another parameter's too (tied weights, tie_word_embeddings): "
                       f"each region's parameters are its own; build the model with "
                       f"config.tie_word_embeddings=False")

    def under(*prefixes: str) -> List[str]:
        return [n for n in named if any(n.startswith(p + ".") for p in prefixes)]

    prefix = f"{layout.base}.{layout.layers}"
    first_parts = [f"{layout.base}.{part}" for part in (layout.embedding, *layout.input_side)]
    regions = [CausalLMRegion(layout.base, DecoderStage(model, layout, [], True, False), under(*first_parts))]
    regions += [CausalLMRegion(f"{prefix}.{i}", DecoderStage(model, layout, [i], False, False), under(f"{prefix}.{i}"))
                for i in range(count)]
    regions.append(CausalLMRegion(f"{layout.base}+{layout.head}", DecoderStage(model, layout, [], False, True),
                                  under(f"{layout.base}.{layout.final_norm}", layout.head)))
    covered = [n for r in regions for n in r.params]
    missing = [n for n in named if n not in covered]
    if missing:  # a part of the base model outside the layout (a family variant): its gradient would be lost
        raise RunError(f"{who}: parameter '{missing[0]}' of {type(model).__name__} is in none of the regions "
                       f"{layout.base}, {prefix}.N, {layout.base}+{layout.head}; build the pipeline model by hand "
                       f"(docs/runner.md)")
    return regions


def stage_module(model: nn.Module, plan: Any, stage: int) -> DecoderStage:
    """Stage ``stage`` of the transformers causal LM ``model`` as ``plan`` splits it.

    Args:
        model: a ``*ForCausalLM`` of a family in ``LAYOUTS``, whole (every rank builds it
            alike, e.g. from one seed or checkpoint); the stage shares its parameters.
        plan: the plan (a path or plan dict, admitted here; or a ``Plan``, read as it is: load
            it once with ``admitted_plan`` when building several stages) whose
            regions name the model's decoder layers (``python -m hp_recompute.costs --module``
            on this model, then ``hp-recompute-plan``).
        stage: the stage index.

    Raises ``RunError`` before building anything when the model is of another family, a
    layer still has HF's own checkpointing on (the plan checkpoints the layers: two
    checkpoints would nest), the plan's layers are not every layer once in order over its
    stages, or tied weights sit on stages of different ranks.
    """
    layout = _layout_of(model, "hp_recompute.hf.stage_module")
    base = getattr(model, layout.base)
    _refuse_hf_checkpointing(model, "hp_recompute.hf.stage_module",
                             "call model.gradient_checkpointing_disable() before building the stages")
    if not isinstance(plan, Plan):  # a Plan comes from the reader, admitted; don't verify it again per stage
        # Here, not at the top: the runner's regions (causal_lm_regions) run on torch 1.13 too,
        # which has no torch.distributed.pipelining for a stage module.
        from .pipelining.schedule import admitted_plan

        plan = admitted_plan(plan)
    if not isinstance(stage, int) or isinstance(stage, bool) or not 0 <= stage < plan.num_stages:
        raise RunError(f"hp_recompute.hf.stage_module: stage must be in [0, {plan.num_stages}) for {plan.path}, "
                       f"got {stage!r}")
    prefix = f"{layout.base}.{layout.layers}"
    count = len(getattr(base, layout.layers))
    per_stage = [_stage_layers(plan, s, prefix, count) for s in range(plan.num_stages)]
    order = [i for layers in per_stage for i in layers]
    if order != list(range(count)):
        raise RunError(f"hp_recompute.hf.stage_module: {plan.path}: its stages hold the layers "
                       f"{per_stage} of '{prefix}', not each of the model's {count} layers once and in order; "
                       f"a stage holds whole decoder layers: plan this model's costs (python -m "
                       f"hp_recompute.costs --module) and, with regions inside layers, split the stages on layer "
                       f"boundaries (hp-recompute-plan --stages)")
    last = plan.num_stages - 1
    stages = [DecoderStage(model, layout, layers, s == 0, s == last) for s, layers in enumerate(per_stage)]
    _check_tied(stages, plan)
    return stages[stage]
