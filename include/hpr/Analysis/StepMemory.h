//===- StepMemory.h - Everything a rank's step allocates --------*- C++ -*-===//
//
// The planner's prediction of what the runner measures at the allocator: a
// rank's activations (ActivationModel.h) plus, as CostModel.h ("step
// memory") and docs/models.md describe them, stage outputs and their
// gradients until the last backward (a sent output, and each sent input
// gradient, until the end of the step: sends are waited for there), I's
// state until W, weight gradients from the stage's first W or B to the end
// of the step (and a second copy while a later split W adds its gradients
// in), each split backward's transient workspace, and a whole backward
// walked region by region (wholeBackwardPeakBytes). With FSDP (dp_shard N > 1):
// a stage's gathered parameters beyond its 1/N shard from UNSHARD to RESHARD,
// and its gradients down to their 1/N shard after REDUCE_GRAD. The sharded
// parameters, held before the step starts, are not counted.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_ANALYSIS_STEPMEMORY_H
#define HPR_ANALYSIS_STEPMEMORY_H

#include "hpr/Analysis/ActivationModel.h"

#include <cstdint>
#include <vector>

namespace mlir::hpr {

/// The peak bytes of `program`'s step, given its activation lifetimes and
/// their profile under `costs`.
int64_t computeStepPeakBytes(ProgramOp program,
                             const ProgramActivations &activations,
                             const ActivationProfile &profile,
                             const std::vector<StageCost> &costs);

} // namespace mlir::hpr

#endif // HPR_ANALYSIS_STEPMEMORY_H
