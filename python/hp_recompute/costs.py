"""Measure each region's forward, dx and dw time: ``python -m hp_recompute.costs``.

Why here, on the runner's regions: the planner's simulated step time is only worth
comparing with a real run when its costs are those of the code that runs. This runs the
model's regions (``runner.model.PipelineModel``, the same functions the runner executes)
one after another, each on a detached input, and times per region the forward, the dx
(``backward_split.backward_input``) and the dw (``backward_split.backward_weight``) as
the runner calls them, on this torch and with the runner's thread count. Each of
``--repeats`` rounds runs the whole chain forward then backward; the first ``--warmup``
rounds are dropped and the median of the rest is written into a copy of the model JSON
(``fwd_time_us``, ``bwd_input_time_us``, ``bwd_weight_time_us``, one full backward
``bwd_time_us`` (a single call: no split analysis, one graph task), and the bytes of the
gradients I keeps for W, ``bwd_weight_input_bytes`` (its input gradient aside: the caller
holds that), and the transient bytes of its backward, ``bwd_input_workspace_bytes``,
``bwd_weight_workspace_bytes`` and ``bwd_workspace_bytes`` for I, W and one full backward,
measured once at the allocator). Checkpointable regions
are also run as the runner runs them when checkpointed: the forward under
``hp_recompute.checkpoint`` (``checkpoint_fwd_time_us``: its saved tensors go to holders)
and one replay through ``recompute_handle`` (``replay_time_us``); and, once at the
allocator, what that forward holds besides its outputs (``checkpoint_state_bytes``: the RNG
states the replay restores, 5056 bytes of CPU generator state per call on torch 2.13) and
what the replay allocates (``replay_bytes``: the saved tensors but the region's input, which
the forward kept and the replay does not allocate again), and of that what the session
still holds after I, which W reads (``replay_weight_bytes``: I runs inside the session as the
runner's does and releases the rest: hpr.split.release-unread). Where this torch has selective
checkpointing (>= 2.4), the same again under the selective policy (NOTE [ Selective policy ]):
``selective_fwd_time_us``, ``selective_replay_time_us``, ``selective_saved_bytes`` (the outputs
it saves, beyond the RNG states) and ``selective_replay_bytes``.

``--from-run REPORT`` measures nothing: it takes the costs from a run instead
(``python -m hp_recompute.run --report``, multi-process). Each of the report's
``measured_action_us`` (the median time of one action of one stage in that run) scales
the region times the planner sums for that action (the planner's own rule,
``regionTimeOf`` in lib/Analysis/CostModel.cpp, through ``hp_recompute._planner``) by measured / priced,
starting from the costs the run's plan was priced with. Planned again with these costs,
the simulated step uses the durations the actions had in the run, under the same
contention, so that the comparison of simulated and measured step time tests the
timeline, not the repeatability of a separate measurement.

``--processes N`` measures in N processes at once and takes the median over all of them:
ranks that share a machine slow each other down (caches, memory bandwidth, SMT siblings;
on the 2-core VM of bench/run two processes run each op 1.5-1.8x slower than one), so
costs for an N-rank run on one machine are measured N at a time.

``--module FILE.py:FACTORY`` measures a plain ``nn.Module`` instead, with no adapter and no
model JSON: its regions are the exporter's (``export.measure.measure_regions``, the planner's
``segmentOps``; ``--regions`` chooses them by module path), its bytes the exporter's, and the
times those of its own forward cut at the regions' boundaries (NOTE [ Cut forward ]); the
model JSON is written from scratch. ``--autocast bfloat16`` measures its forwards under
``torch.autocast``, as mixed-precision training runs them (the bytes of what they save, too).

    python -m hp_recompute.costs --model-json examples/gpt/gpt.model.json -o gpt.costed.json
    python -m hp_recompute.costs --module examples/llama/model.py:build --input-shape 2x64 \
        --input-dtype int64 -o llama.costed.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from .backward_split import backward_input, backward_weight
from .errors import RunError
from .export.inputs import add_module_arguments, check_module_arguments
from .checkpoint import checkpoint, recompute_handle_collector_ctx
from .compile_split import stashed_tensors
from .factory import raised_at
from .native import planner_extension
from .output_files import OutputError, check_outputs, text_writer, write_outputs
from .runner.model import DEFAULT_MODEL, PipelineModel, load_model
from .runner.memory import AllocatorPeak
from .selective import selective_context_fn, selective_supported
from .plan.reader import read_json, region_checkpoint
from .processes import rank_start_method
from .sessions import clear_recompute_session, recompute_handle, recompute_session_ctx
from .storage import storage_of

__all__ = ["ModuleMeasurement", "RunnerMeasurement", "measure_region_times", "measure_module_times",
           "measure_concurrently", "times_from_run", "main"]

TIME_KEYS = ("fwd_time_us", "bwd_input_time_us", "bwd_weight_time_us", "bwd_time_us")
BYTES_KEYS = ("bwd_weight_input_bytes", "bwd_input_workspace_bytes", "bwd_weight_workspace_bytes",
              "bwd_workspace_bytes")
#: Per checkpoint policy: the forward and replay times, then the bytes held (besides the
#: input) and replayed.
FULL_KEYS = ("checkpoint_fwd_time_us", "replay_time_us")
FULL_BYTES_KEYS = ("checkpoint_state_bytes", "replay_bytes", "replay_weight_bytes")
SELECTIVE_KEYS = ("selective_fwd_time_us", "selective_replay_time_us")
SELECTIVE_BYTES_KEYS = ("selective_saved_bytes", "selective_replay_bytes")
#: The policies measured (hpr.selective.priced-as-run, hpr.selective.supported): full, and selective where
#: this torch has it; each as the ``context_fn`` of its checkpoint.
_POLICIES: List[Optional[Callable[[], Any]]] = [None] + ([selective_context_fn()] if selective_supported() else [])
CHECKPOINT_KEYS = FULL_KEYS + (SELECTIVE_KEYS if len(_POLICIES) > 1 else ())
CHECKPOINT_BYTES_KEYS = FULL_BYTES_KEYS + (SELECTIVE_BYTES_KEYS if len(_POLICIES) > 1 else ())
_SESSION = "hp_recompute.costs"


def _leaf(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().requires_grad_(True)
    return x


def _distinct_bytes(tensors: Any, besides: Sequence[Optional[torch.Tensor]] = ()) -> int:
    """Bytes of the distinct storages behind ``tensors`` (None entries skipped) but those of ``besides``."""
    other = {storage_of(t).data_ptr() for t in besides if t is not None}
    seen: Dict[int, int] = {}
    for t in tensors:
        if t is not None:
            storage = storage_of(t)
            if storage.data_ptr() not in other:
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _weight_state_bytes(state: Any, dxs: Sequence[Optional[torch.Tensor]]) -> int:
    """What I keeps for W: the gradients it recorded and the stash of each compiled block it
    split (hpr.compiled-split.partition: the values of I that W reads), but the input
    gradients it returned (their storage is the caller's, which sends or hands them on: the
    planner counts them there)."""
    recorded = [g for grads in state.recorded.values() for g in grads]
    return _distinct_bytes(recorded + stashed_tensors(state.compiled), dxs)


def _backward_workspace(outs: List[torch.Tensor], grads_out: Any, inputs: List[torch.Tensor],
                        weights: List[torch.Tensor]) -> Tuple[Tuple[int, int, int], List[Optional[torch.Tensor]]]:
    """Transient bytes of a region's I, W and one full backward (B, last: it frees the graph),
    each one's allocator peak above what it leaves behind; and the input gradients B made.

    B runs as the runtimes run it, in place (``autograd.backward(inputs=...)``, torch's stage
    backward): each weight gradient added into a ``.grad`` already there, as in every B of a
    stage but its first (whose gradients the planner counts apart), so that the fresh copy it
    adds in is counted and not kept. On a forward the allocator saw (run under an earlier
    ``AllocatorPeak``), B's peak nets the saved tensors it frees as it goes (the planner adds
    what the regions keep, docs/models.md: "Cost model")."""
    meters = [AllocatorPeak() for _ in range(3)]
    with meters[0]:
        _, state = backward_input(outs, grads_out, inputs, weights, retain_graph=True)
    with meters[1]:
        backward_weight(state, retain_graph=True)
    dxs: List[Optional[torch.Tensor]] = []
    if inputs or weights:
        before = [(t, t.grad) for t in inputs + weights]
        for t in inputs:
            t.grad = None
        for w in weights:
            w.grad = torch.zeros_like(w)
        with meters[2]:
            torch.autograd.backward(outs, grads_out, inputs=inputs + weights)
        dxs = [t.grad for t in inputs]
        for t, grad in before:
            t.grad = grad
    return tuple((m.peak or 0) - max(m.net or 0, 0) for m in meters), dxs  # type: ignore[return-value]


@contextlib.contextmanager
def _stopwatch(into: List[float]) -> Iterator[None]:
    """Appends the seconds the block took to ``into``."""
    t0 = time.perf_counter()
    yield
    into.append(time.perf_counter() - t0)


def _checkpoint_and_replay(fn: Callable[..., Any], args: Sequence[Any], kwargs: Dict[str, Any],
                           forward: ContextManager[Any], replay: ContextManager[Any],
                           context_fn: Optional[Callable[[], Any]],
                           after_replay: Optional[Callable[[List[torch.Tensor], List[Any]], None]] = None
                           ) -> List[torch.Tensor]:
    """Runs ``fn(*args, **kwargs)`` under ``hp_recompute.checkpoint`` (with ``context_fn``, a
    policy of ``_POLICIES``) inside ``forward`` and its one replay through ``recompute_handle``
    inside ``replay``, as the runner does, then ``after_replay(outputs, handles)`` where given,
    then clears the replay. Returns the forward's output tensors."""
    from torch.utils._pytree import tree_flatten

    options = {} if context_fn is None else {"context_fn": context_fn}
    with forward, recompute_handle_collector_ctx() as handles:
        out = checkpoint(fn, *args, **options, **kwargs)
    outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    try:
        with replay:
            for handle in handles:
                recompute_handle(handle, _SESSION)
        if after_replay is not None:
            after_replay(outputs, handles)
    finally:
        clear_recompute_session(_SESSION)
    return outputs


def _held_after_dx(args: Sequence[Any], kwargs: Dict[str, Any], weights: Sequence[torch.Tensor],
                   into: List[int]) -> Callable[[List[torch.Tensor], List[Any]], None]:
    """An ``after_replay`` that runs I on the outputs inside the session, as the runner's dx
    does (retaining it for W), and appends to ``into`` the bytes I released from the session
    (hpr.split.release-unread): what it held before I and not after, counted by distinct
    storage, but the weights and the region's inputs. The replay's bytes less these are
    ``replay_weight_bytes``."""
    from torch.utils._pytree import tree_flatten

    leaves = [t for t in tree_flatten((list(args), kwargs))[0] if isinstance(t, torch.Tensor)]
    inputs = [t for t in leaves if t.requires_grad]
    trained = [w for w in weights if w.requires_grad]

    def measure(outputs: List[torch.Tensor], handles: List[Any]) -> None:
        own = {storage_of(t).data_ptr() for t in leaves + list(weights)}
        frames = [f for f in (h.frame() for h in handles) if f is not None]

        def held() -> int:
            return _distinct_bytes(t for f in frames for t in f.retained() if storage_of(t).data_ptr() not in own)

        before = held()
        outs = [o for o in outputs if o.requires_grad]
        if outs:
            with recompute_session_ctx(_SESSION, retain_on_unpack=True):
                backward_input(outs, [torch.ones_like(o) for o in outs], inputs, trained)
        into.append(max(before - held(), 0))

    return measure


def _checkpointed_times(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Tuple[float, ...]:
    """The times of ``fn(*args, **kwargs)`` under each policy's checkpoint, in seconds: its forward
    and one replay (CHECKPOINT_KEYS)."""
    seconds: List[float] = []
    for context_fn in _POLICIES:
        _checkpoint_and_replay(fn, args, kwargs, _stopwatch(seconds), _stopwatch(seconds), context_fn)
    return tuple(seconds)


def _checkpoint_bytes(fn: Callable[..., Any], args: Sequence[Any], kwargs: Dict[str, Any],
                      weights: Sequence[torch.Tensor]) -> Tuple[int, ...]:
    """At the allocator, for ``fn(*args, **kwargs)`` under each policy's checkpoint
    (CHECKPOINT_BYTES_KEYS): the bytes its forward holds besides its outputs (what the checkpoint
    keeps to replay: the RNG states, and a selective one's saved outputs, counted without the
    states), and the bytes one replay allocates; for the full policy also what the session still
    holds after I (``_held_after_dx``, of ``weights``; a selective checkpoint releases nothing). The planner holds the first with the region's
    input from forward to last backward, the second from recompute to clear, or to I where a W
    follows and the third from there (docs/models.md, "Cost model")."""
    measured: List[int] = []
    for context_fn in _POLICIES:
        forward, replay = AllocatorPeak(), AllocatorPeak()
        after_dx: List[int] = []
        outputs = _checkpoint_and_replay(fn, args, kwargs, forward, replay, context_fn,
                                         None if measured else _held_after_dx(args, kwargs, weights, after_dx))
        held = max((forward.net or 0) - _distinct_bytes(outputs), 0)
        if measured:  # beyond the RNG states every policy's checkpoint holds
            held = max(held - measured[0], 0)
        replayed = max(replay.net or 0, 0)
        measured += [held, replayed] + [max(replayed - released, 0) for released in after_dx]
    return tuple(measured)


def measure_region_times(model: PipelineModel, batch: Any, repeats: int, warmup: int) -> Dict[str, Dict[str, float]]:
    """Median times of every region, in microseconds (TIME_KEYS; CHECKPOINT_KEYS if checkpointable)."""
    params = dict(model.module.named_parameters())
    state_bytes: Dict[str, int] = {}
    workspace: Dict[str, Tuple[int, int, int]] = {}
    held: Dict[str, Tuple[int, ...]] = {}
    samples: Dict[str, Dict[str, List[float]]] = {
        r.name: {k: [] for k in TIME_KEYS + (CHECKPOINT_KEYS if r.checkpointable else ())} for r in model.regions}
    for round_ in range(repeats):
        chain = []
        x = batch
        for index, region in enumerate(model.regions):
            inp = x if index == 0 else _leaf(x)  # as the runner: stage 0 gets the batch as it is
            t0 = time.perf_counter()
            out = region.fn(inp, batch)
            chain.append((region, inp, out, time.perf_counter() - t0))
            if region.checkpointable and round_ >= warmup:
                for key, seconds in zip(CHECKPOINT_KEYS, _checkpointed_times(region.fn, inp, batch)):
                    samples[region.name][key].append(seconds * 1e6)
            x = out
        grad: Optional[torch.Tensor] = None
        for region, inp, out, fwd_s in reversed(chain):
            weights = [params[n] for n in region.params if params[n].requires_grad]
            inputs = [inp] if isinstance(inp, torch.Tensor) and inp.requires_grad else []
            grads_out = None if grad is None else [grad]
            if round_ == warmup:  # once, under the allocator meter: not timed
                with AllocatorPeak():  # the allocator learns what the forward saves: B's meter sees it freed
                    out = region.fn(inp, batch)
                workspace[region.name], _ = _backward_workspace([out], grads_out, inputs, weights)
                out = region.fn(inp, batch)
            t0 = time.perf_counter()
            dxs, state = backward_input([out], grads_out, inputs, weights)
            t1 = time.perf_counter()
            kept = _weight_state_bytes(state, dxs)
            backward_weight(state)
            t2 = time.perf_counter()
            again = region.fn(inp, batch)  # B is one call: time it on a fresh graph
            t3 = time.perf_counter()
            if inputs or weights:
                torch.autograd.grad([again], inputs + weights, grads_out, allow_unused=True)
            t4 = time.perf_counter()
            grad = dxs[0] if inputs else None
            if round_ >= warmup:
                for key, seconds in zip(TIME_KEYS, (fwd_s, t1 - t0, t2 - t1, t4 - t3)):
                    samples[region.name][key].append(seconds * 1e6)
                state_bytes[region.name] = kept
    # Last and untimed: measured within the rounds, it moved some later workspace measurements
    # by one RNG state (5056 bytes) from run to run.
    x = batch
    for index, region in enumerate(model.regions):
        inp = x if index == 0 else _leaf(x)
        if region.checkpointable:
            held[region.name] = _checkpoint_bytes(region.fn, (inp, batch), {},
                                                  [params[n] for n in region.params])
        x = region.fn(inp, batch)
    out: Dict[str, Dict[str, float]] = {}
    for name, keys in samples.items():
        out[name] = {k: statistics.median(v) for k, v in keys.items()}
        out[name].update(zip(BYTES_KEYS, (state_bytes[name], *workspace[name])))
        out[name].update(zip(CHECKPOINT_BYTES_KEYS, held.get(name, ())))
    return out


@dataclass
class RunnerMeasurement:
    """``measure_region_times`` of the runner model ``spec`` on the microbatch of ``seed``."""

    spec: Optional[str]
    seed: int
    repeats: int
    warmup: int

    def prepare(self) -> Callable[[], Dict[str, Dict[str, float]]]:
        """Builds the model and its batch; returns the measurement to run."""
        model = load_model(self.spec)
        batch = model.make_batch(torch.Generator().manual_seed(self.seed))
        return lambda: measure_region_times(model, batch, self.repeats, self.warmup)


@dataclass
class ModuleMeasurement:
    """``measure_module_times`` of the plain module ``FILE.py:FACTORY`` (``--module``) on its
    example inputs, its regions found as ``measure_regions`` finds them."""

    spec: str
    shapes: List[List[int]]
    dtypes: List[torch.dtype]
    seed: int
    region_depth: int
    regions: Optional[str]
    model_output: Optional[str]
    repeats: int
    warmup: int
    autocast: Optional[torch.dtype] = None

    def build(self) -> Tuple[torch.nn.Module, Tuple[torch.Tensor, ...], List[Any], str]:
        """The module in training mode (its forward returning ``model_output``: ``SelectedOutput``;
        run under ``torch.autocast(autocast)`` where given), its example inputs, its segments, and
        what ``SelectedOutput`` chose (or "")."""
        from .export.inputs import SelectedOutput, load_factory, make_inputs
        from .export.measure import measure_regions, resolve_regions

        model = load_factory(self.spec)
        regions = resolve_regions(model, self.regions) if self.regions is not None else None
        inputs = make_inputs(self.shapes, self.dtypes, seed=self.seed)
        model.train()
        selected = SelectedOutput(model, self.model_output).apply()  # the tool's own model, to the end
        if self.autocast is not None:
            _autocast_forward(model, self.autocast)
        segments = measure_regions(model, inputs, self.region_depth, name=self.spec, regions=regions)
        return model, inputs, segments, selected.note

    def prepare(self) -> Callable[[], Dict[str, Dict[str, float]]]:
        model, inputs, segments, _ = self.build()
        return lambda: measure_module_times(model, inputs, segments, self.repeats, self.warmup)


def _measure_in_child(queue: Any, start: Any, measurement: Any, threads: int) -> None:
    try:
        torch.set_num_threads(threads)
        measure = measurement.prepare()
        start.wait()  # every process measures at the same time
        queue.put(("ok", measure()))
    except threading.BrokenBarrierError:  # another process failed first and says why
        queue.put(("aborted", None))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        start.abort()
        queue.put(("error", str(e) if isinstance(e, RunError) else raised_at(e)))


def measure_concurrently(measurement: Any, threads: int, processes: int) -> Dict[str, Dict[str, float]]:
    """A measurement (``RunnerMeasurement`` or ``ModuleMeasurement``) in ``processes``
    processes at once; the median over them."""
    import multiprocessing

    ctx = multiprocessing.get_context(rank_start_method())
    queue, start = ctx.Queue(), ctx.Barrier(processes)
    procs = [ctx.Process(target=_measure_in_child, args=(queue, start, measurement, threads))
             for _ in range(processes)]
    for proc in procs:
        proc.start()
    results: List[Dict[str, Dict[str, float]]] = []
    aborted = 0
    try:
        while len(results) + aborted < processes:
            try:
                kind, value = queue.get(timeout=1)
            except Exception:  # queue.Empty: is everyone still alive?
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RunError(f"hp_recompute.costs: a measuring process died (exit code {dead[0]})") from None
                continue
            if kind == "error":
                raise RunError(f"hp_recompute.costs: measuring the model failed: {value}")
            if kind == "aborted":
                aborted += 1
                continue
            results.append(value)
        if aborted:
            raise RunError("hp_recompute.costs: measuring the model failed: the processes' start barrier broke")
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
    return {name: {k: keys[k] if k.endswith("_bytes") else statistics.median(r[name][k] for r in results)
                   for k in keys}  # bytes are the same in every process
            for name, keys in results[0].items()}


def _finite(value: Any) -> bool:
    """A JSON number the planner reads: not a boolean, not NaN or infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def times_from_run(names: Sequence[str], report_path: str,
                   output: Optional[Tuple[str, str]] = None) -> Dict[str, Dict[str, float]]:
    """Region times from a run's report (module docstring, ``--from-run``) for the regions ``names``.

    The starting point is the plan the run executed: its regions carry the costs it was
    priced with. A forward's plain and checkpointed runs share the plain regions'
    ``fwd_time_us``; the plain forward's ratio is applied last. ``output`` (flag, path), the
    file the times go to, must not be that plan (hpr.output.not-an-input: OutputError)."""
    report = read_json(report_path, "run report")
    ranks = report.get("ranks") if isinstance(report, dict) else None
    if not isinstance(ranks, list) or not all(isinstance(r, dict) and "measured_action_us" in r for r in ranks):
        raise RunError(f"hp_recompute.costs: {report_path}: /ranks: expected measured_action_us per rank "
                       f"(a multi-process report of python -m hp_recompute.run)")
    for i, rank in enumerate(ranks):
        for j, m in enumerate(rank["measured_action_us"]):
            if not (isinstance(m, dict) and isinstance(m.get("op"), str) and isinstance(m.get("stage"), int)
                    and isinstance(m.get("plain"), bool) and _finite(m.get("median_us")) and m["median_us"] >= 0):
                raise RunError(f"hp_recompute.costs: {report_path}: /ranks/{i}/measured_action_us/{j}: expected "
                               f"an object with op, stage, plain and median_us (a finite number >= 0)")
    if not isinstance(report.get("plan"), str):
        raise RunError(f"hp_recompute.costs: {report_path}: /plan: expected the path of the plan the run executed")
    plan_path = report["plan"]
    if output is not None:
        check_outputs([output], [("--from-run's /plan", plan_path)])
    plan = read_json(plan_path, "plan the run executed")
    try:
        stages = {st["stage"]: st["regions"] for st in plan["model"]["stages"]}
        priced = {r["name"]: r for regions in stages.values() for r in regions}
        checkpointed = {r["name"]: region_checkpoint(r) for r in priced.values()}
    except ValueError as e:
        raise RunError(f"hp_recompute.costs: {plan_path}: /model/stages: {e}") from None
    except (KeyError, TypeError, AttributeError):
        raise RunError(f"hp_recompute.costs: {plan_path}: /model/stages: expected stages of named regions "
                       f"(a plan JSON of hp-recompute-plan)") from None
    # A piece times part of a replay, and its backward the rest (hpr.exec.replay-in-pieces):
    # neither is a time regionTimeOf prices.
    for r, rank in enumerate(plan.get("ranks") or []):
        for k, a in enumerate(rank.get("actions") or [] if isinstance(rank, dict) else []):
            if isinstance(a, dict) and a.get("op") == "recompute" and "regions" in a:
                raise RunError(f"hp_recompute.costs: {plan_path}: /ranks/{r}/actions/{k}: the run replayed a session in "
                               f"pieces (a recompute with regions), whose times are parts of a replay; take --from-run "
                               f"from a run of a plan without pieces (hp-recompute-plan without --prefetch bubble)")
    if sorted(priced) != sorted(names):
        raise RunError(f"hp_recompute.costs: {plan_path}: its regions [{', '.join(priced)}] are not the model "
                       f"JSON's [{', '.join(names)}]")
    times: Dict[str, Dict[str, float]] = {}
    for name, region in priced.items():
        keys = TIME_KEYS + (FULL_KEYS if region.get("checkpointable") else ())
        keys += SELECTIVE_KEYS if region_checkpoint(region) == "selective" else ()
        missing = [k for k in keys if not _finite(region.get(k)) or region[k] <= 0]
        if missing:
            raise RunError(f"hp_recompute.costs: {plan_path}: region '{name}' has no {missing[0]}: plan with "
                           f"costs measured by python -m hp_recompute.costs before taking them from a run")
        times[name] = {k: float(region[k]) for k in keys}
        # The rest was measured with the times: it comes along.
        times[name].update({k: region[k] for k in SELECTIVE_KEYS + BYTES_KEYS + FULL_BYTES_KEYS + SELECTIVE_BYTES_KEYS
                            if k in region and k not in times[name]})
    planner = planner_extension()
    for rank in ranks:
        for measured in rank["measured_action_us"]:
            op, stage, plain = measured["op"], measured["stage"], measured["plain"]
            # The region fields the planner sums into this action's time (regionTimeOf); a backward
            # with its replay inside ("backward+recompute", hpr.exec.in-backward) sums both.
            fields = [(r["name"], planner.region_time_field(part, stage, not plain, checkpointed[r["name"]]))
                      for part in op.split("+") for r in stages.get(stage, [])]
            fields = [(name, key) for name, key in fields if key]
            modelled = sum(times[name][key] for name, key in fields)
            if modelled > 0:
                for name, key in fields:
                    times[name][key] *= measured["median_us"] / modelled
    return times


# ---------------------------------------------------------------------------
# A plain nn.Module (--module): its forward cut at the regions' boundaries
# ---------------------------------------------------------------------------
#
# NOTE [ Cut forward ]
# A plain module has no region functions to call one by one (there is no adapter), only its
# own forward. So the forward runs whole, with each region's module call cut out of the
# autograd graph on both sides, by the rules below (docs/rules.md states each one and why):
#   hpr.cut.detached-leaves       a detached leaf on each side of a region's call
#   hpr.cut.forward-times         a region's time is its call, the code outside regions the gaps
#   hpr.cut.backward-in-reverse   the backward segment by segment, in reverse
#   hpr.cut.segment-order         the segments measure_regions returned, in their order
#   hpr.cut.stateless-regions     a region that keeps bytes between calls stops the measurement


@dataclass
class _Call:
    """One region module's call in a cut forward (hpr.cut.detached-leaves)."""

    name: str
    enter: float  # perf_counter when called: the code before it ends
    leave: float  # after it (and after its checkpointed run): the code after it starts
    fwd_s: float
    checkpointed: Optional[Tuple[float, ...]]  # CHECKPOINT_KEYS
    cut_in: List[Tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (argument, its leaf)
    outs: List[torch.Tensor] = field(default_factory=list)  # its results, graph inside the region
    cut_out: List[torch.Tensor] = field(default_factory=list)  # the leaves the caller got, one per result


@dataclass
class _Piece:
    """One segment's graph in a cut forward, or an untimed bridge (``name`` None, hpr.cut.forward-times)."""

    name: Optional[str]
    fwd_s: float
    outs: List[torch.Tensor]
    out_keys: List[int]
    ins: List[torch.Tensor]
    in_keys: List[int]
    weights: List[torch.Tensor]


def _autocast_forward(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """``model``'s forward (the tool's own model, to the end) under ``torch.autocast`` to
    ``dtype`` on its parameters' device, as mixed-precision training runs it: every forward
    the tool measures, the regions' checkpointed ones and replays inside it, and none of the
    backwards (run after the forward returned; a replay in one restores the forward's
    autocast state, as torch's checkpoint does)."""
    device = next((p.device.type for p in model.parameters()), "cpu")
    forward = model.forward

    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device, dtype=dtype):
            return forward(*args, **kwargs)

    model.forward = autocast_forward  # type: ignore[method-assign]


def _needs_grad(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())


def _cut_forward(model: torch.nn.Module, inputs: Sequence[torch.Tensor], names: Sequence[str],
                 checkpointed: bool, held: Optional[Dict[str, Tuple[int, ...]]] = None, first: bool = False
                 ) -> Tuple[List[_Call], List[torch.Tensor], float, float]:
    """Runs ``model(*inputs)`` with the calls of the modules ``names`` cut (hpr.cut.detached-leaves).

    Returns (the calls in order, the module's outputs that need grad, start, end). With
    ``checkpointed``, each region also runs under ``hp_recompute.checkpoint`` and replays once
    right after its plain call, outside the times of the code around it. With ``held``, each
    region's checkpoint bytes (``_checkpoint_bytes``) are measured into it, also outside those
    times. ``first``: the measurement's first forward, where each region is checked to keep
    no state between calls (hpr.cut.stateless-regions) before any other call repeats it."""
    from torch.utils._pytree import tree_flatten, tree_map

    modules = dict(model.named_modules())
    calls: List[_Call] = []
    patched: List[Tuple[torch.nn.Module, bool, Any]] = []

    def cut(name: str, forward: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            enter = time.perf_counter()
            cut_in: List[Tuple[torch.Tensor, torch.Tensor]] = []

            def leaf_in(t: Any) -> Any:
                if not _needs_grad(t):
                    return t
                leaf = t.detach().requires_grad_(True)
                cut_in.append((t, leaf))
                return leaf

            args, kwargs = tree_map(leaf_in, (args, kwargs))
            t0 = time.perf_counter()
            out = forward(*args, **kwargs)
            fwd_s = time.perf_counter() - t0
            if first:
                _refuse_kept_state(model, name, forward, args, kwargs)
            ckpt = _checkpointed_times(forward, *args, **kwargs) if checkpointed else None
            if held is not None:
                held[name] = _checkpoint_bytes(forward, args, kwargs, list(modules[name].parameters()))
            record = _Call(name, enter, 0.0, fwd_s, ckpt, cut_in)

            def leaf_out(t: Any) -> Any:
                if not _needs_grad(t):
                    return t
                leaf = t.detach().requires_grad_(True)
                record.outs.append(t)
                record.cut_out.append(leaf)
                return leaf

            out = tree_map(leaf_out, out)
            record.leave = time.perf_counter()
            calls.append(record)
            return out

        return call

    for name in names:
        module = modules[name]
        patched.append((module, "forward" in module.__dict__, module.__dict__.get("forward")))
        module.forward = cut(name, module.forward)  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        out = model(*inputs)
        end = time.perf_counter()
    finally:
        for module, had, forward in patched:
            if had:
                module.forward = forward  # type: ignore[method-assign]
            else:
                del module.forward
    return calls, [t for t in tree_flatten(out)[0] if _needs_grad(t)], start, end


def _refuse_kept_state(model: torch.nn.Module, name: str, forward: Callable[..., Any], args: Sequence[Any],
                       kwargs: Dict[str, Any]) -> None:
    """hpr.cut.stateless-regions: ``RunError`` if each of two calls of region ``name`` without grad keeps bytes
    beyond its outputs."""
    from torch.utils._pytree import tree_flatten

    kept: List[int] = []
    failed = ""
    for _ in range(2):
        meter = AllocatorPeak()
        try:
            with torch.no_grad(), meter:
                out = forward(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the same call failing the second time: state it kept
            failed = raised_at(e)
            break
        kept.append((meter.net or 0) - _distinct_bytes(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)))
        del out
    if not failed and min(kept) <= 0:
        return
    given = [f"{k}={type(v).__name__}" for k, v in kwargs.items()
             if v is not None and not isinstance(v, (torch.Tensor, bool, int, float, str, tuple, list, dict))]
    config = getattr(model, "config", None)
    fix = ("build the model with use_cache=False (its config has use_cache=True; Hugging Face turns caches off "
           "under gradient checkpointing, so training grows none)" if getattr(config, "use_cache", None) is True
           else "make the forward leave nothing behind between calls while it is measured")
    what = (f"fails when called again on the same arguments ({failed})" if failed
            else f"keeps {min(kept)} bytes beyond its outputs after each call (two calls without grad)")
    raise RunError(f"hp_recompute.costs: region '{name}' {what}" + (f", given {', '.join(given)}" if given else "")
                   + f": its forward keeps state between calls, so what is measured on a repeated call is not what "
                   f"one call does; {fix}")


def _pieces(segments: Sequence[Any], calls: List[_Call], outputs: List[torch.Tensor], start: float, end: float,
            weights_of: Dict[str, List[torch.Tensor]]) -> List[_Piece]:
    """The segments' graphs of one cut forward, in order (hpr.cut.forward-times, hpr.cut.segment-order)."""
    regions = [s.name for s in segments if s.checkpointable]
    if [c.name for c in calls] != regions:
        raise RunError(f"hp_recompute.costs: the cut forward called the regions [{', '.join(c.name for c in calls)}], "
                       f"not [{', '.join(regions)}] as the measured one did; a region must be called once per "
                       f"forward, always in the same order")
    leaves = {id(t) for c in calls for t in c.cut_out}
    pieces: List[_Piece] = []
    outside: Dict[int, str] = {}  # index of the region call before (-1: none) -> segment outside regions
    before = -1
    for seg in segments:
        if seg.checkpointable:
            before += 1
        else:
            outside[before] = seg.name
    for k in range(-1, len(calls)):
        prev = calls[k] if k >= 0 else None
        nxt = calls[k + 1] if k + 1 < len(calls) else None
        if prev is not None:
            pieces.append(_Piece(prev.name, prev.fwd_s, prev.outs, [id(t) for t in prev.cut_out],
                                 [leaf for _, leaf in prev.cut_in], [id(t) for t, _ in prev.cut_in],
                                 weights_of[prev.name]))
        # The code after ``prev``: what it hands on is what the next call was cut from (or the
        # module's outputs), unless that is a leaf of ``prev`` passed on untouched.
        handed = [t for t, _ in nxt.cut_in] if nxt is not None else outputs
        handed = [t for t in handed if id(t) not in leaves]
        gap = (nxt.enter if nxt is not None else end) - (prev.leave if prev is not None else start)
        name = outside.get(k)
        if name is not None or handed:
            ins = prev.cut_out if prev is not None else []
            pieces.append(_Piece(name, gap, handed, [id(t) for t in handed], list(ins), [id(t) for t in ins],
                                 weights_of.get(name, []) if name is not None else []))
    return pieces


def _backward_pieces(pieces: List[_Piece], outputs: List[torch.Tensor], split: bool,
                     samples: Optional[Dict[str, Dict[str, List[float]]]], kept: Dict[str, int],
                     workspace: Optional[Dict[str, Tuple[int, int, int]]] = None) -> None:
    """Backward of a cut forward, piece by piece in reverse (hpr.cut.backward-in-reverse): I then W
    (``split``), or B.
    Adds the times to ``samples`` (when given), the bytes I keeps for W to ``kept``; with
    ``workspace``, measures each piece's transient bytes first (untimed round)."""
    grads: Dict[int, torch.Tensor] = {id(t): torch.ones_like(t) for t in outputs}
    for piece in reversed(pieces):
        pairs = [(t, grads[k]) for t, k in zip(piece.outs, piece.out_keys) if k in grads]
        if not pairs or not (piece.ins or piece.weights):
            continue
        outs, grads_out = [t for t, _ in pairs], [g for _, g in pairs]
        ins = list(piece.ins)
        t0 = time.perf_counter()
        if workspace is not None and piece.name is not None:  # untimed
            workspace[piece.name], dxs = _backward_workspace(outs, grads_out, ins, piece.weights)
            times = {}
        elif split:
            dxs, state = backward_input(outs, grads_out, ins, piece.weights)
            t1 = time.perf_counter()
            if piece.name is not None:
                kept[piece.name] = _weight_state_bytes(state, dxs)
            backward_weight(state)
            t2 = time.perf_counter()
            times = {"bwd_input_time_us": t1 - t0, "bwd_weight_time_us": t2 - t1}
        else:
            dxs = list(torch.autograd.grad(outs, ins + piece.weights, grads_out, allow_unused=True))[:len(ins)]
            times = {"bwd_time_us": time.perf_counter() - t0}
        if samples is not None and piece.name is not None:
            for key, seconds in times.items():
                samples[piece.name][key].append(seconds * 1e6)
        for key, dx in zip(piece.in_keys, dxs):
            if dx is not None:
                grads[key] = grads[key] + dx if key in grads else dx


def measure_module_times(model: torch.nn.Module, inputs: Sequence[torch.Tensor], segments: Sequence[Any],
                         repeats: int, warmup: int) -> Dict[str, Dict[str, float]]:
    """Median times of every segment of a plain module, in microseconds, by cut forwards
    (NOTE [ Cut forward ]): TIME_KEYS for all, CHECKPOINT_KEYS for the regions, BYTES_KEYS.

    Args:
        segments: ``export.measure.measure_regions(model, inputs, ...)``, the planner's segments.
        repeats, warmup: rounds, and how many are dropped first; each round is one cut forward
            with the split backward (I, W; regions also checkpointed and replayed) and one with
            the full backward (B, and the forward times).
    """
    by_ptr: Dict[int, List[torch.Tensor]] = {}
    for p in model.parameters():
        if p.requires_grad:
            by_ptr.setdefault(storage_of(p).data_ptr(), []).append(p)
    weights_of = {s.name: [p for ptr in s.params for p in by_ptr.get(ptr, [])] for s in segments}
    names = [s.name for s in segments if s.checkpointable]
    samples: Dict[str, Dict[str, List[float]]] = {
        s.name: {k: [] for k in TIME_KEYS + (CHECKPOINT_KEYS if s.checkpointable else ())} for s in segments}
    kept: Dict[str, int] = {}
    workspace: Dict[str, Tuple[int, int, int]] = {}
    _cut_forward(model, inputs, names, checkpointed=False, first=True)  # its checks meter calls of their own
    with AllocatorPeak():  # the allocator learns what the forward saves: B's meter sees it freed
        calls, outputs, start, end = _cut_forward(model, inputs, names, checkpointed=False)
    _backward_pieces(_pieces(segments, calls, outputs, start, end, weights_of), outputs, False, None, kept,
                     workspace)  # once, under the allocator meter: not timed
    for round_ in range(repeats):
        timed = round_ >= warmup
        calls, outputs, start, end = _cut_forward(model, inputs, names, checkpointed=timed)
        _backward_pieces(_pieces(segments, calls, outputs, start, end, weights_of), outputs, True,
                         samples if timed else None, kept)
        if timed:
            for call in calls:
                for key, seconds in zip(CHECKPOINT_KEYS, call.checkpointed or ()):
                    samples[call.name][key].append(seconds * 1e6)
        del calls, outputs
        calls, outputs, start, end = _cut_forward(model, inputs, names, checkpointed=False)
        pieces = _pieces(segments, calls, outputs, start, end, weights_of)
        _backward_pieces(pieces, outputs, False, samples if timed else None, kept)
        if timed:
            for piece in pieces:
                if piece.name is not None:
                    samples[piece.name]["fwd_time_us"].append(piece.fwd_s * 1e6)
        del calls, outputs, pieces
    held: Dict[str, Tuple[int, ...]] = {}  # last, as in measure_region_times
    _cut_forward(model, inputs, names, checkpointed=False, held=held)
    out: Dict[str, Dict[str, float]] = {}
    for name, keys in samples.items():
        out[name] = {k: statistics.median(v) if v else 0.0 for k, v in keys.items()}
        out[name].update(zip(BYTES_KEYS, (kept.get(name, 0), *workspace.get(name, (0, 0, 0)))))
        out[name].update(zip(CHECKPOINT_BYTES_KEYS, held.get(name, ())))
    return out


#: ``--autocast``'s dtypes.
AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}

#: Bounds of the numeric flags (a usage error outside them, not a measurement that never ends).
MAX_REPEATS = 10_000
MAX_THREADS = 1024
MAX_PROCESSES = 64
MAX_SEED = 1 << 63


def _non_finite(graph: Dict[str, Any], times: Dict[str, Dict[str, float]]) -> Optional[str]:
    """The JSON path of the first written time or byte count that is NaN or infinite, or None."""
    for i, region in enumerate(graph["regions"]):
        for key, value in times[region["name"]].items():
            if not math.isfinite(value):
                return f"/regions/{i}/{key} (region '{region['name']}') is {value}"
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point; returns the exit status (0 ok, 1 bad input, 2 usage)."""
    p = argparse.ArgumentParser(prog="python -m hp_recompute.costs", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-json", default=None,
                   help="model JSON whose region names are the runner's regions of --model (or: --module)")
    p.add_argument("--model", default=None,
                   help="FILE.py:FACTORY returning a runner PipelineModel (default: the bundled GPT example)")
    add_module_arguments(p, required=False)
    p.add_argument("--regions", default=None, metavar="PATH[,PATH...]",
                   help="with --module: the regions' module paths instead of --region-depth's rule; a ModuleList, "
                        "a ModuleDict or PATH.* stands for its children (--regions layers)")
    p.add_argument("-o", "--output", required=True,
                   help="where to write the model JSON with measured times (- for stdout)")
    p.add_argument("--repeats", type=int, default=12, help="rounds, default 12")
    p.add_argument("--warmup", type=int, default=2, help="rounds dropped first, default 2")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the runner's ranks)")
    p.add_argument("--processes", type=int, default=1,
                   help="measure in this many processes at once, as many ranks share the machine (default 1)")
    p.add_argument("--seed", type=int, default=0, help="data seed of the measured microbatch")
    p.add_argument("--from-run", default=None, metavar="REPORT",
                   help="measure nothing: take the times from this run report (module docstring)")
    p.add_argument("--autocast", default=None, choices=sorted(AUTOCAST_DTYPES),
                   help="with --module: run its forwards under torch.autocast to this dtype, as mixed-precision "
                        "training does (the backwards outside it)")
    args = p.parse_args(argv)
    check_module_arguments(p, args)
    if (args.module is None) == (args.model_json is None):
        p.error("give either --module FILE.py:FACTORY (a plain nn.Module, measured as it is) or --model-json "
                "MODEL.json (the regions of the runner's --model)")
    if args.module is not None:
        for flag, value in (("--model", args.model), ("--from-run", args.from_run)):
            if value is not None:
                p.error(f"{flag} goes with --model-json (the runner's regions); --module measures the module itself")
        if args.regions == "":
            p.error("--regions: an empty value")
        if args.regions is not None and args.region_depth != 1:
            p.error("--regions names the regions, --region-depth finds them by a rule: give one of the two")
    elif args.regions is not None or args.input_shape is not None or args.region_depth != 1 or args.autocast:
        p.error("--regions, --input-shape, --input-dtype, --region-depth and --autocast go with --module")
    if not 1 <= args.repeats <= MAX_REPEATS:
        p.error(f"--repeats must be in [1, {MAX_REPEATS}], got {args.repeats}")
    if not 0 <= args.warmup < args.repeats:
        p.error(f"--warmup must be in [0, --repeats), got {args.warmup} with --repeats {args.repeats}")
    if not 1 <= args.threads <= MAX_THREADS:
        p.error(f"--threads must be in [1, {MAX_THREADS}], got {args.threads}")
    if not 1 <= args.processes <= MAX_PROCESSES:
        p.error(f"--processes must be in [1, {MAX_PROCESSES}], got {args.processes}")
    if not 0 <= args.seed < MAX_SEED:
        p.error(f"--seed must be in [0, 2^63), got {args.seed}")
    for flag, value in (("--model-json", args.model_json), ("--model", args.model), ("--from-run", args.from_run)):
        if value == "":
            p.error(f"{flag}: an empty value")
    if args.module is not None:
        return _main_module(args)
    output = ("-o", args.output)
    inputs = [("--model-json", args.model_json), ("--model", args.model.rpartition(":")[0] if args.model else DEFAULT_MODEL)]
    if args.from_run is not None:
        inputs.append(("--from-run", args.from_run))
    try:
        check_outputs([output], inputs)
        graph = read_json(args.model_json, "model JSON")
        regions = graph.get("regions") if isinstance(graph, dict) else None
        if not isinstance(regions, list) or not all(isinstance(r, dict) and "name" in r for r in regions):
            raise RunError(f"hp_recompute.costs: {args.model_json}: /regions: expected a list of region objects")
        if args.from_run is not None:
            times = times_from_run([r["name"] for r in regions], args.from_run, output)
            source = f"times: python -m hp_recompute.costs --from-run {os.path.basename(args.from_run)}"
        else:
            times = _measure(args, regions)
            source = (f"times: python -m hp_recompute.costs, torch {torch.__version__}, {args.threads} thread(s) "
                      f"x {args.processes} process(es), median of {args.repeats - args.warmup}")
        bad = _non_finite(graph, times)
        if bad:  # the planner reads finite numbers only: writing this would only defer the error
            raise RunError(f"hp_recompute.costs: -o {args.output}: not written: {bad}; the planner reads only "
                           f"finite numbers" + (f" (check the times in {args.from_run})" if args.from_run else ""))
    except OutputError as e:
        print(f"hp_recompute.costs: {e}", file=sys.stderr)
        return 2 if e.usage else 1
    except RunError as e:
        print(e, file=sys.stderr)
        return 1
    return _write(args, graph, times, source)


def _write(args: argparse.Namespace, graph: Dict[str, Any], times: Dict[str, Dict[str, float]], source: str) -> int:
    """Writes ``graph`` with ``times`` to ``-o`` and prints the table; the exit status."""
    for region in graph["regions"]:
        measured = times[region["name"]]
        # not measured here (hpr.selective.supported): none of the input's stays
        if not set(SELECTIVE_KEYS) <= set(measured):
            for key in SELECTIVE_KEYS + SELECTIVE_BYTES_KEYS:
                region.pop(key, None)
        region.update({k: v if k.endswith("_bytes") else round(v, 3) for k, v in measured.items()})
    graph["source"] = f"{graph.get('source', '')}; {source}".lstrip("; ")
    try:
        write_outputs([("-o", args.output, text_writer(json.dumps(graph, indent=2, allow_nan=False) + "\n"))])
    except OutputError as e:
        print(f"hp_recompute.costs: {e}", file=sys.stderr)
        return 1
    table = sys.stderr if args.output == "-" else sys.stdout  # stdout holds the JSON then
    width = max([12] + [len(name) for name in times])
    print(f"{'region':<{width}} {'fwd_us':>9} {'dx_us':>9} {'dw_us':>9} {'bwd_us':>9} {'dx/fwd':>7} {'dw/fwd':>7} "
          f"{'ckpt_fwd':>9} {'replay':>9}" + (f" {'sel_fwd':>9} {'sel_repl':>9}" if CHECKPOINT_KEYS != FULL_KEYS
                                               else ""), file=table)
    for name, t in times.items():
        f, i, w, b = (t[k] for k in TIME_KEYS)
        extra = " ".join(f"{t[k]:9.1f}" for k in CHECKPOINT_KEYS if k in t)
        ratios = f"{i / f:7.2f} {w / f:7.2f}" if f > 0 else f"{'-':>7} {'-':>7}"
        print(f"{name:<{width}} {f:9.1f} {i:9.1f} {w:9.1f} {b:9.1f} {ratios} {extra}", file=table)
    return 0


def _main_module(args: argparse.Namespace) -> int:
    """``--module``: measure a plain ``nn.Module`` (NOTE [ Cut forward ]) and write its model JSON."""
    from .export.graph import model_graph
    from .export.inputs import ExportError, describe_inputs, module_inputs
    from .export.measure import RegionError

    torch.set_num_threads(args.threads)
    try:
        shapes, dtypes = module_inputs(args)
        check_outputs([("-o", args.output)], [("--module", args.module.rpartition(":")[0])])
        measurement = ModuleMeasurement(args.module, shapes, dtypes, args.seed, args.region_depth, args.regions,
                                        args.model_output, args.repeats, args.warmup,
                                        AUTOCAST_DTYPES[args.autocast] if args.autocast else None)
        try:
            model, inputs, segments, note = measurement.build()
            if note:
                print(note, file=sys.stderr)
            graph = model_graph(type(model).__name__, segments)
            if args.processes > 1:
                del model, inputs
                times = measure_concurrently(measurement, args.threads, args.processes)
            else:
                times = measure_module_times(model, inputs, segments, args.repeats, args.warmup)
        except (ExportError, RegionError, RunError):
            raise
        except BaseException as e:  # noqa: BLE001 - the model's own failure, located; SystemExit included
            raise RunError(f"hp_recompute.costs: measuring {args.module} on inputs {describe_inputs(shapes, dtypes)} "
                           f"(--input-shape, --input-dtype) failed: {raised_at(e)}") from None
        bad = _non_finite(graph, times)
        if bad:
            raise RunError(f"hp_recompute.costs: -o {args.output}: not written: {bad}; the planner reads only "
                           f"finite numbers")
    except OutputError as e:
        print(f"hp_recompute.costs: {e}", file=sys.stderr)
        return 2 if e.usage else 1
    except ExportError as e:
        print(e, file=sys.stderr)
        return 2 if e.usage else 1
    except RegionError as e:
        print(f"hp_recompute.costs: {e}", file=sys.stderr)
        return 1
    except RunError as e:
        print(e, file=sys.stderr)
        return 1
    source = (f"python -m hp_recompute.costs --module {args.module} --input-shape {args.input_shape} --input-dtype "
              f"{args.input_dtype}" + (f" --regions {args.regions}" if args.regions is not None else "")
              + (f" --model-output {args.model_output}" if args.model_output is not None else "")
              + (f" --autocast {args.autocast}" if args.autocast else "")
              + f", torch {torch.__version__}, {args.threads} thread(s) x {args.processes} process(es), median of "
              f"{args.repeats - args.warmup}")
    return _write(args, graph, times, source)


def _measure(args: argparse.Namespace, regions: List[Dict[str, Any]]) -> Dict[str, Dict[str, float]]:
    """The measured times of the model's regions, whose names ``regions`` must list in order."""
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    names = [r.name for r in model.regions]
    if [r["name"] for r in regions] != names:
        raise RunError(f"hp_recompute.costs: {args.model_json}: /regions: names "
                       f"[{', '.join(str(r['name']) for r in regions)}] are not model '{model.name}''s regions "
                       f"[{', '.join(names)}]")
    if args.processes > 1:
        return measure_concurrently(RunnerMeasurement(args.model, args.seed, args.repeats, args.warmup),
                                    args.threads, args.processes)
    batch = model.make_batch(torch.Generator().manual_seed(args.seed))
    try:
        return measure_region_times(model, batch, args.repeats, args.warmup)
    except BaseException as e:  # noqa: BLE001 - the model's own failure, located; SystemExit included
        raise RunError(f"hp_recompute.costs: measuring model '{model.name}' failed: {raised_at(e)}") from None


if __name__ == "__main__":
    sys.exit(main())
