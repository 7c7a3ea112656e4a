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
//  - a recompute replays the checkpointed regions;
//  - memory kept from forward to backward: saved bytes of the regions that
//    are not checkpointed plus the boundary input of those that are (all
//    saved bytes for a `no_checkpoint` microbatch);
//  - memory a recompute brings back: the checkpointed regions' saved bytes;
//  - step memory beyond activations: the stage output (the next stage's
//    first input_bytes) and its gradient, the weight gradients (param_bytes)
//    and what I keeps for W (bwd_weight_input_bytes); a backward action
//    transiently needs its largest region's bwd_workspace_bytes on top.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_ANALYSIS_COSTMODEL_H
#define HPR_ANALYSIS_COSTMODEL_H

#include "hpr/Dialect/HPR/HPROps.h"

#include "llvm/ADT/STLFunctionalExtras.h"

#include <cstdint>
#include <vector>

namespace mlir::hpr {

/// dx and dw time per forward time of a region whose backward was not
/// profiled: the bundled GPT's blocks measured with `python -m
/// hp_recompute.costs` (torch 2.13, CPU, one thread; docs/models.md).
inline constexpr double kInputPerForward = 1.5;
inline constexpr double kWeightPerForward = 1.1;

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
  int64_t outputBytes = 0;      ///< the stage output (next stage's input)
  int64_t gradBytes = 0;        ///< weight gradients (the regions' params)
  int64_t weightStateBytes = 0; ///< what I keeps for W
  int64_t workspaceBytes = 0;   ///< transient bytes of a backward action
};

/// Costs of every stage of `model`, indexed by stage. `isCheckpointed`
/// decides which regions count as checkpointed (default: the `checkpoint`
/// attribute), so that a pass can price a choice before making it.
std::vector<StageCost>
computeStageCosts(ModelOp model,
                  llvm::function_ref<bool(RegionOp)> isCheckpointed = {});

/// Whether `forward` runs under checkpoint: its stage has a checkpointed
/// region and the forward is not marked `no_checkpoint`.
bool runsCheckpointed(ForwardOp forward, const std::vector<StageCost> &costs);

/// What one forward of `cost`'s stage keeps until its last backward.
inline int64_t keptBytesOf(const StageCost &cost, bool checkpointed) {
  return checkpointed ? cost.keptBytes : cost.plainKeptBytes;
}

} // namespace mlir::hpr

#endif // HPR_ANALYSIS_COSTMODEL_H
