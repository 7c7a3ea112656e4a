//===- StepMemory.cpp - Everything a rank's step allocates ---------------===//

#include "hpr/Analysis/StepMemory.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/Sequence.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::hpr;

int64_t mlir::hpr::computeStepPeakBytes(ProgramOp program,
                                        const ProgramActivations &activations,
                                        const ActivationProfile &profile,
                                        const std::vector<StageCost> &costs) {
  int64_t peak = 0;
  // Where each (stage, mb)'s output and its gradient die: its last backward,
  // at which the lifetime's index is kept.
  std::vector<int64_t> lastBackwardOf(activations.numPositions, -1);
  for (auto [index, lifetime] : llvm::enumerate(activations.lifetimes))
    if (lifetime.hasConsumers)
      lastBackwardOf[lifetime.lastConsumerPos] = index;

  // A forward handed its input over in memory by the previous stage on this
  // rank keeps that stage's output itself (counted below, from the forward
  // that made it): the activations count it again from that forward to its
  // last backward, which is taken off here.
  ArrayRef<int64_t> stageToRank =
      program->getParentOfType<ScheduleOp>().getStageToRank();
  auto rank = static_cast<int64_t>(program.getRank());
  std::vector<int64_t> liveAt = profile.live, endingAt = profile.endingAt;
  std::vector<int64_t> handedFrom(liveAt.size() + 1, 0); // differences
  for (const ActivationLifetime &lifetime : activations.lifetimes) {
    int64_t stage = lifetime.stage;
    if (stage == 0 || stageToRank[stage - 1] != rank ||
        !lifetime.hasConsumers || !runsCheckpointed(lifetime.forward, costs))
      continue;
    int64_t handed = costs[stage].keptInputBytes;
    handedFrom[lifetime.forwardPos] += handed;
    handedFrom[lifetime.lastConsumerPos + 1] -= handed;
    endingAt[lifetime.lastConsumerPos] -= handed;
  }
  int64_t handed = 0;
  for (auto [at, delta] : llvm::zip(liveAt, handedFrom))
    at -= handed += delta;

  // Beyond activations: what the header lists, in program order.
  int64_t other = 0;
  llvm::DenseSet<int64_t> gradsAllocated;
  int64_t lastStage = static_cast<int64_t>(costs.size()) - 1;
  unsigned pos = 0;
  for (Operation &op : program.getBody().getOps()) {
    int64_t live = liveAt[pos++];
    auto action = dyn_cast<ActionOpInterface>(op);
    if (!action)
      continue; // A session allocates nothing.
    int64_t stage = action.getStageIndex();
    // FSDP: the gathered parameters, from UNSHARD to RESHARD: FSDP2 copies
    // the all-gather into full-size parameters beside the shard the rank
    // always holds; after REDUCE_GRAD the rank keeps its gradients' shard
    // only (the reduce-scatter writes it beside the full gradients).
    if (isa<UnshardOp, ReshardOp>(op))
      other += isa<UnshardOp>(op) ? costs[stage].paramBytes
                                  : -costs[stage].paramBytes;
    if (isa<ReduceGradOp>(op) && costs[stage].dpShard > 1 &&
        gradsAllocated.contains(stage)) {
      int64_t shard = costs[stage].shardedParamBytes();
      peak = std::max(peak, live + other + shard);
      other -= costs[stage].paramBytes - shard;
    }
    if (isa<ForwardOp, RecvBOp>(op))
      other += costs[stage].outputBytes;
    // Sends are waited for at the end of the step (the runtimes' transports,
    // as torch's schedules), so a sent tensor lives until then: an input
    // gradient sent here, and below a stage output sent to the next rank.
    if (isa<SendBOp>(op) && stage > 0)
      other += costs[stage - 1].outputBytes;
    // dx handed to a co-located previous stage becomes its output gradient.
    bool producesDx = isa<BackwardInputOp, BackwardOp>(op) && stage > 0;
    if (producesDx && stageToRank[stage - 1] == rank)
      other += costs[stage - 1].outputBytes;
    peak = std::max(peak, live + other);
    if (!isa<ConsumerOpInterface>(op))
      continue;
    // The action's own transient bytes. A whole backward (B, or the first
    // stage's W) runs in place, region by region, last to first
    // (wholeBackwardPeakBytes, on top of what the forward kept, where the
    // profile holds the session's replay); the stage's first one allocates
    // the weight gradients as it goes, each later one adds a region's fresh
    // copy in as it makes it (in the region's workspace).
    const StageCost &cost = costs[stage];
    auto consumer = cast<ConsumerOpInterface>(op);
    int64_t lifetime = lastBackwardOf[pos - 1];
    bool firstGradients = !gradsAllocated.contains(stage);
    int64_t workspace = 0;
    if (consumer.isWholeBackward() && lifetime >= 0) {
      const ActivationLifetime &walked = activations.lifetimes[lifetime];
      bool checkpointed = profile.underCheckpoint[lifetime];
      llvm::SmallVector<int64_t> replayedBefore = walked.prefetchedRegions();
      if (checkpointed && !walked.replayInBackward)
        replayedBefore =
            llvm::to_vector(llvm::seq<int64_t>(0, cost.replayedRegions.size()));
      workspace = wholeBackwardPeakBytes(cost, checkpointed, replayedBefore) -
                  profile.replayAtLastConsumer[lifetime] +
                  (firstGradients ? cost.paramBytes : 0);
    } else if (isa<BackwardInputOp>(op)) {
      workspace = cost.inputWorkspaceBytes;
    } else if (isa<BackwardWeightOp>(op)) {
      workspace = cost.weightWorkspaceBytes;
    }
    peak = std::max(peak, live + other + workspace);
    // What the backward frees as it goes: on the last consumer the
    // microbatch's activations, replayed tensors (read without retaining)
    // and I's state for W (all in the activation profile), its output and
    // the output's gradient; a sent output lives on (to the end of the
    // step), and the model output's gradient lived inside the backward only.
    if (lifetime >= 0) {
      bool sent = stage == lastStage || stageToRank[stage + 1] != rank;
      other -= costs[stage].outputBytes * (sent ? 1 : 2);
    }
    // Weight gradients: the stage's first W or B allocates them for the rest
    // of the step. A later W that is not a whole backward is one call per
    // weight group over a retained graph: its fresh copy meets every
    // activation still there.
    if (isa<BackwardWeightOp, BackwardOp>(op)) {
      if (firstGradients)
        other += costs[stage].paramBytes;
      else if (!consumer.isWholeBackward())
        peak = std::max(peak, live + other + costs[stage].paramBytes);
      gradsAllocated.insert(stage);
    }
    peak = std::max(peak, live - endingAt[pos - 1] + other);
  }
  return peak;
}
