//===- CostModel.h - Per-stage time and memory of a module ------*- C++ -*-===//
//
// The planner's cost model, read from the module's hpr.model (docs/models.md,
// "Cost model"):
//  - forward time of a stage: the sum of its regions' fwd_time_us; a region
//    that was not profiled counts fwd_flops / 1e6 us (1 TFLOP/s); a model
//    with neither counts 1 per stage (the unit-time model);
//  - a checkpointed region's forward takes checkpoint_fwd_time_us and its
//    replay replay_time_us when measured, else fwd_time_us; a microbatch
//    whose forward is marked `no_checkpoint` runs every region plainly;
//  - dx (I) and dw (W) of a region: its measured bwd_input_time_us and
//    bwd_weight_time_us, else kInputPerForward and kWeightPerForward times
//    its forward; a full backward (B, one autograd call): its measured
//    bwd_time_us, else I + W (the split does no extra work, but it makes
//    more calls); the first stage's input needs no gradient, so its I is 0
//    (and keeps nothing) and its W is its full backward (the runtime's W
//    there is one call from the output); the unit-time
//    model has F = I = W = 1;
//  - a selective region (docs/models.md, "Policies") takes its measured
//    selective_fwd_time_us and selective_replay_time_us instead, keeps its
//    selective_saved_bytes on top of input and state, and its replay brings
//    back selective_replay_bytes;
//  - a recompute replays the checkpointed regions;
//  - memory kept from forward to backward: saved bytes of the regions that
//    are not checkpointed plus the boundary input and checkpoint state (RNG
//    states) of those that are (all saved bytes for a `no_checkpoint`
//    microbatch);
//  - memory a recompute brings back: the checkpointed regions' replay bytes
//    when measured, else their saved bytes; of that, a session read by dx
//    and dw holds after dx only what dw reads, replay_weight_bytes when
//    measured (else all of it; a selective region keeps all of it);
//  - what I keeps for W (bwd_weight_input_bytes), from I to W: counted
//    with the activations (ActivationModel.h), as deferring W holds it;
//  - step memory beyond activations: the stage output (the next stage's
//    first input_bytes) and its gradient and the weight gradients
//    (param_bytes); a backward action
//    transiently needs its largest region's workspace on top (that of its
//    kind: bwd_input_workspace_bytes, bwd_weight_workspace_bytes, else
//    bwd_workspace_bytes, the full backward's);
//  - data parallelism (the model's dp_shard N and dp_replicate M): UNSHARD
//    all-gathers the stage's param_bytes over N ranks, REDUCE_GRAD
//    reduce-scatters its gradients over N and, with M > 1, all-reduces the
//    1/N shard over M (allGatherUs, allReduceUs); RESHARD costs nothing. A
//    stage's parameters take param_bytes from UNSHARD to RESHARD and
//    param_bytes / N otherwise, its gradients param_bytes / N after
//    REDUCE_GRAD (StepMemory.h counts what a step adds to the sharded
//    parameters).
//
//===----------------------------------------------------------------------===//

#ifndef HPR_ANALYSIS_COSTMODEL_H
#define HPR_ANALYSIS_COSTMODEL_H

#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Schedule/Schedule.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace mlir::hpr {

/// dx and dw time per forward time of a region whose backward was not
/// profiled: the bundled GPT's blocks measured with `python -m
/// hp_recompute.costs` (torch 2.13, CPU, one thread; docs/models.md).
inline constexpr double kInputPerForward = 1.5;
inline constexpr double kWeightPerForward = 1.1;

/// The collective model (docs/models.md, "Data parallelism"): one link of
/// kCollectiveBytesPerUs (25 GB/s, an inter-node link per GPU) and a fixed
/// kCollectiveLatencyUs per collective.
inline constexpr double kCollectiveBytesPerUs = 25e3;
inline constexpr double kCollectiveLatencyUs = 10;

/// An all-gather (or reduce-scatter) of `bytes` over `ranks` ring members:
/// (ranks - 1) / ranks * bytes / bandwidth + latency; 0 for one rank or no
/// bytes.
double allGatherUs(int64_t bytes, int64_t ranks);

/// An all-reduce of `bytes` over `ranks`: 2 (ranks - 1) / ranks * bytes /
/// bandwidth + latency; 0 for one rank or no bytes.
double allReduceUs(int64_t bytes, int64_t ranks);

/// The times a region carries (model JSON and plan JSON fields).
enum class RegionTime {
  Forward,           ///< fwd_time_us
  CheckpointForward, ///< checkpoint_fwd_time_us
  Replay,            ///< replay_time_us
  SelectiveForward,  ///< selective_fwd_time_us
  SelectiveReplay,   ///< selective_replay_time_us
  BackwardInput,     ///< bwd_input_time_us
  BackwardWeight,    ///< bwd_weight_time_us
  Backward,          ///< bwd_time_us
};

/// The JSON field of `time`, e.g. "bwd_input_time_us".
llvm::StringRef regionTimeKey(RegionTime time);

/// How a region is checkpointed: not, fully, or by the selective policy.
enum class RegionCheckpoint { None, Full, Selective };

/// `region`'s checkpoint as its attributes say.
RegionCheckpoint regionCheckpointOf(RegionOp region);

/// Whether checkpointing `region` can save memory: it is checkpointable and
/// saves more than its boundary input (checkpointing any other region only
/// costs time). The regions hpr-select-checkpoints chooses among.
bool isCheckpointCandidate(RegionOp region);

/// The plan JSON spelling of `checkpoint` for the Python bindings ("none",
/// "full", "selective") and back; none when unknown.
llvm::StringRef regionCheckpointName(RegionCheckpoint checkpoint);
std::optional<RegionCheckpoint> parseRegionCheckpoint(llvm::StringRef name);

/// The cost rule, the one place that says which of a region's times the
/// planner adds into an action of its stage: a forward takes each region's
/// checkpoint_fwd_time_us when the region is checkpointed and the forward
/// runs under checkpoint (`checkpointedForward`), else its fwd_time_us; a
/// recompute the checkpointed regions' replay_time_us (for a selective
/// region, selective_fwd_time_us and selective_replay_time_us); I, W and B
/// their bwd_input_time_us, bwd_weight_time_us and bwd_time_us, except on the
/// first stage (`firstStage`), whose I is priced 0 (the model input needs no
/// gradient) and whose W is its B. None: the region adds nothing (a
/// transfer, a clear, a recompute of a plain region). computeStageCosts sums
/// by it, and `python -m hp_recompute.costs --from-run` scales by it.
std::optional<RegionTime> regionTimeOf(sched::ActionKind kind, bool firstStage,
                                       bool checkpointedForward,
                                       RegionCheckpoint regionCheckpoint);

/// `region`'s `time` in us: measured, else the fallback of the file
/// comment (FLOPs at 1 TFLOP/s, kInputPerForward, ...).
double regionTimeUs(RegionOp region, RegionTime time);

/// One checkpointed region of a stage: what replaying it alone costs. A
/// replay piece (hpr.recompute `regions`) numbers a stage's checkpointed
/// regions 0.. in forward order, as StageCost::replayedRegions holds them.
struct ReplayedRegionCost {
  double replayUs = 0;
  int64_t replayBytes = 0;
  /// Of replayBytes, what a session still holds after dx (what dw reads).
  int64_t weightReplayBytes = 0;
  /// What the stage's regions up to and including this one keep from
  /// forward to backward (a whole backward has freed the rest when it
  /// reaches this region).
  int64_t keptThrough = 0;
};

/// One region of a stage as a whole backward (B, or the first stage's W)
/// meets it: the backward runs the regions last to first, in place (each
/// weight gradient added into `.grad` as it is reached, as torch's stage
/// backward and the runner do), and frees what a region kept as it leaves it.
struct BackwardRegionCost {
  /// What regions 0..j keep from forward to backward, under checkpoint and
  /// with every region plain.
  int64_t keptThrough = 0, plainKeptThrough = 0;
  /// Index into `StageCost::replayedRegions`; -1 for a region kept plain.
  int64_t replayed = -1;
  /// `bwd_workspace_bytes`: the region's backward above what it starts with.
  int64_t workspaceBytes = 0;
  /// The gradient of its output, which the backward of the next region made
  /// (that region's `input_bytes`). For a stage's last region, 0: the stage
  /// output's gradient is counted with the stage output; but for the model's
  /// last region, whose output's gradient the loss makes inside the backward
  /// (the stage's outputBytes).
  int64_t outputGradBytes = 0;
};

struct StageCost {
  bool checkpointed = false; ///< has at least one checkpointed region
  double forwardUs = 0;      ///< under checkpoint, as the regions say
  double plainForwardUs = 0; ///< every region plain (`no_checkpoint`)
  double backwardInputUs = 0;
  double backwardWeightUs = 0;
  double backwardUs = 0; ///< a full backward (B)
  double recomputeUs = 0;
  int64_t keptBytes = 0;      ///< under checkpoint, as the regions say
  int64_t plainKeptBytes = 0; ///< every region plain
  int64_t recomputedBytes = 0;
  /// Of recomputedBytes, what a session read by dx and dw holds after dx.
  int64_t weightRecomputedBytes = 0;
  /// What a replay inside a whole backward holds on top of `keptBytes`, at
  /// its worst (ActivationModel.h). The backward runs the regions last to
  /// first and frees what each keeps as it finishes it; a checkpointed region
  /// replays when the backward reaches it, so region j's replay meets what
  /// regions 0..j keep: max over checkpointed j of (replay_j - what the
  /// regions after j keep), at least 0.
  int64_t backwardReplayBytes = 0;
  /// The checkpointed regions, in forward order.
  std::vector<ReplayedRegionCost> replayedRegions;
  /// Every region, in forward order.
  std::vector<BackwardRegionCost> backwardRegions;
  /// The stage output: the next stage's input; the last stage's, the model
  /// output (its last region's `output_bytes`, 0 when not measured).
  int64_t outputBytes = 0;
  /// Of keptBytes, the stage input itself (its first region checkpointed
  /// keeps it): where the previous stage runs on the same rank and hands
  /// its output over in memory, one tensor with that stage's output.
  int64_t keptInputBytes = 0;
  /// The regions' param_bytes: the unsharded parameters, and as many bytes
  /// of weight gradients.
  int64_t paramBytes = 0;
  int64_t weightStateBytes = 0; ///< what I keeps for W
  /// A region is checkpointed under a selective policy, whose replay reads
  /// the outputs its forward saved, once: a session of the stage cannot
  /// replay again for its dw (hpr.session.replay-for-weight;
  /// hpr-select-checkpoints keeps such stages off selective).
  bool replaysOnce = false;
  /// Transient bytes of a backward_input: its largest region's.
  int64_t inputWorkspaceBytes = 0;
  int64_t weightWorkspaceBytes = 0; ///< ... of a backward_weight
  int64_t dpShard = 1;              ///< ranks the parameters are sharded over
  double unshardUs = 0;             ///< UNSHARD: all-gather over dpShard
  double reduceGradUs = 0;          ///< REDUCE_GRAD: reduce-scatter, all-reduce

  /// Parameter bytes one rank holds while the stage is sharded.
  int64_t shardedParamBytes() const { return paramBytes / dpShard; }
};

/// Costs of every stage of `model`, indexed by stage. `checkpointOf` says
/// how each region counts as checkpointed (default: its attributes,
/// regionCheckpointOf), so that a pass can price a choice before making it.
std::vector<StageCost> computeStageCosts(
    ModelOp model,
    llvm::function_ref<RegionCheckpoint(RegionOp)> checkpointOf = {});

/// Whether `forward` runs under checkpoint: its stage has a checkpointed
/// region and the forward is not marked `no_checkpoint`.
bool runsCheckpointed(ForwardOp forward, const std::vector<StageCost> &costs);

/// The time and the bytes of replaying the checkpointed regions `regions`
/// (indices into `cost.replayedRegions`) of one forward: a replay piece.
double replayUsOf(const StageCost &cost, llvm::ArrayRef<int64_t> regions);
int64_t replayBytesOf(const StageCost &cost, llvm::ArrayRef<int64_t> regions);
/// Of replayBytesOf, what a session still holds after dx.
int64_t weightReplayBytesOf(const StageCost &cost,
                            llvm::ArrayRef<int64_t> regions);

/// What a whole backward holds on top of `cost.keptBytes`, at its worst,
/// when the checkpointed regions `prefetched` were replayed before it and
/// the others replay inside it (ActivationModel.h). It starts holding every
/// prefetched region's tensors, runs the regions last to first and drops a
/// region's replayed and kept tensors as it leaves it, so region j meets
/// what regions 0..j keep, its own replay, and the prefetched replays of the
/// regions before it. With nothing prefetched: backwardReplayBytes.
int64_t backwardReplayBytesAfter(const StageCost &cost,
                                 llvm::ArrayRef<int64_t> prefetched);

/// What a whole backward (B, or the first stage's W) holds at its worst on
/// top of what the forward kept (keptBytesOf `checkpointed`), when the
/// checkpointed regions `replayedBefore` were replayed before it and the
/// others replay inside it: running the regions last to first, region j
/// meets what regions 0..j keep, the replays held of regions before it, its
/// own replayed tensors, its workspace and its output's gradient. Weight
/// gradients not yet allocated are not included. A plain forward (not
/// `checkpointed`) replays nothing.
int64_t wholeBackwardPeakBytes(const StageCost &cost, bool checkpointed,
                               llvm::ArrayRef<int64_t> replayedBefore);

/// What one forward of `cost`'s stage keeps until its last backward.
inline int64_t keptBytesOf(const StageCost &cost, bool checkpointed) {
  return checkpointed ? cost.keptBytes : cost.plainKeptBytes;
}

} // namespace mlir::hpr

#endif // HPR_ANALYSIS_COSTMODEL_H
