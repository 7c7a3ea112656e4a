//===- ActivationModel.h - Activation bytes live on a rank ------*- C++ -*-===//
//
// The planner's memory model of activations, one definition for the summary
// and for the passes that choose by memory (hpr-select-checkpoints,
// hpr-prefetch-into-bubbles). Positions are the indices of
// the ops of a program's block, session ops included. For each (stage,
// microbatch) that a program runs the forward of:
//  - what its forward keeps (CostModel.h: keptBytesOf) is live from the
//    forward to its last backward action, inclusive (to the end of the
//    program when it has none);
//  - when the forward runs under checkpoint, what the replay brings back
//    (recomputedBytes) is live from its hpr.recompute (before one is
//    placed: its first backward action, where jit puts it) to its last
//    backward action, or to the op before its hpr.clear;
//  - except for a replay inside its backward (`in_backward`, which jit
//    places where replaysInBackward says): at that backward only, one
//    region at a time, as the backward reaches it, after the regions behind
//    it freed what they kept (backwardReplayBytes);
//  - a replay in pieces (hpr.recompute `regions`): each piece placed before
//    the reader brings back its regions from its position to the op before
//    the reader when the last piece is `in_backward` (that backward then
//    holds backwardReplayBytesAfter the prefetched regions), else to the op
//    before the clear;
//  - a session read first by a dx and later by a dw (`releasedAfterDx`)
//    holds its whole replay up to the dx and, after it, only what the dw
//    reads (weightRecomputedBytes; hpr.split.release-unread), each piece
//    alike;
//  - unless its dw says `weight_replay`: then the dx drops the whole replay
//    and a second one, of what the dw reads (weightRecomputedBytes), lives
//    from its hpr.recompute {for_weight} (before one is placed: the dw, where
//    hpr-insert-recompute puts it) to the dw or the op before the clear;
//    nothing of the replay lives in between (pieces alike). Only where the
//    forward runs checkpointed: a plain microbatch replays nothing;
//  - what such a dx keeps for its dw (the gradients dw's matmuls read,
//    weightStateBytes: bwd_weight_input_bytes) is live from the dx to the
//    dw, inclusive, checkpointed or not: a budget sees what deferring a dw
//    holds.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_ANALYSIS_ACTIVATIONMODEL_H
#define HPR_ANALYSIS_ACTIVATIONMODEL_H

#include "hpr/Analysis/CostModel.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <vector>

namespace mlir::hpr {

/// A piece of a replay placed before its reader: hpr.recompute with
/// `regions` and without `in_backward`.
struct ReplayPiece {
  unsigned pos = 0;
  llvm::SmallVector<int64_t, 2> regions;
};

/// Where one (stage, microbatch)'s activations live in its rank's program.
/// Its backward actions are those that read activations
/// (ConsumerOpInterface::readsActivations).
struct ActivationLifetime {
  ForwardOp forward;
  int64_t stage = 0;
  int64_t microbatch = 0;
  unsigned forwardPos = 0;
  /// Backward actions of the (stage, microbatch); both are the program's
  /// last position when it has none.
  unsigned firstConsumerPos = 0;
  unsigned lastConsumerPos = 0;
  bool hasConsumers = false;
  /// The replayed tensors' span (see the file comment).
  unsigned replayBeginPos = 0;
  unsigned replayEndPos = 0;
  /// Whether an hpr.recompute of it is in the program.
  bool replayPlaced = false;
  /// Whether the replay runs inside its one backward (see the file comment);
  /// with pieces, whether its last piece does.
  bool replayInBackward = false;
  /// Whether its first reader is a dx and a dw reads it later: the dx
  /// releases what the dw does not read.
  bool releasedAfterDx = false;
  /// Whether that dw says `weight_replay`: the dx drops the replay and a
  /// second one, from `weightReplayPos`, brings back what the dw reads.
  bool weightReplay = false;
  /// Where the replay for the dw starts: its hpr.recompute {for_weight},
  /// else the dw (jit); and whether that recompute is in the program.
  unsigned weightReplayPos = 0;
  bool weightReplayPlaced = false;
  /// The pieces placed before the reader, in program order (empty: the
  /// replay is one op).
  llvm::SmallVector<ReplayPiece, 1> prefetchedPieces;

  /// The checkpointed regions the prefetched pieces replay.
  llvm::SmallVector<int64_t> prefetchedRegions() const;
};

/// The placement rule, once: a session read by exactly one action, a whole
/// backward (B, or the first stage's W, whose I reads nothing: HPROps.td),
/// replays inside it, region by region, when it is recomputed jit. A session
/// read by I and W cannot: W reads what I read, so the replayed tensors live
/// from I to W whichever way they were replayed.
bool replaysInBackward(llvm::ArrayRef<Operation *> consumers);

/// The bytes `lifetime`'s replay adds at once, one op: `cost.recomputedBytes`,
/// or for a replay inside its backward what that backward holds on top of
/// what the forward keeps (backwardReplayBytesAfter its prefetched pieces).
int64_t replayedBytesOf(const StageCost &cost,
                        const ActivationLifetime &lifetime);

/// The lifetimes of one program, in forward order.
struct ProgramActivations {
  std::vector<ActivationLifetime> lifetimes;
  unsigned numPositions = 0;
};

ProgramActivations collectActivationLifetimes(ProgramOp program);

/// Activation bytes live at each position, and the bytes whose lifetime
/// ends there (freed by the op at that position).
struct ActivationProfile {
  std::vector<int64_t> live;
  std::vector<int64_t> endingAt;
  /// Per lifetime (in ProgramActivations order): whether its forward runs
  /// under checkpoint, and its replayed bytes live at its last backward.
  std::vector<char> underCheckpoint;
  std::vector<int64_t> replayAtLastConsumer;
  int64_t peak() const;
};

/// The most recomputed (stage, microbatch)s whose replayed tensors are live
/// at one position: placed recomputes, each from its recompute to its clear
/// (or last consumer while none is inserted), a session replayed again for
/// its dw from its recompute to its dx and from the replay for the dw on. The
/// summary's `max-live`.
unsigned countMaxLiveReplays(const ProgramActivations &activations);

/// The profile under `costs`, with `checkpointed` saying which forwards run
/// under checkpoint (default: runsCheckpointed).
ActivationProfile computeActivationProfile(
    const ProgramActivations &activations, const std::vector<StageCost> &costs,
    llvm::function_ref<bool(const ActivationLifetime &)> checkpointed = {});

} // namespace mlir::hpr

#endif // HPR_ANALYSIS_ACTIVATIONMODEL_H
