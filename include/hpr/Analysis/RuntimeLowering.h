//===- RuntimeLowering.h - What a runtime reads off each action -*- C++ -*-===//
//
// The rules that lower a planned schedule to what its runtimes execute
// without deriving anything: when each receive is posted (`posts`), which
// receives an action reads (`waits`), the message tag of each transfer
// (`tag`), the last W or B of each stage (`last_backward`), the last backward
// of each (stage, microbatch) (`frees_graph`), the in-memory handoffs
// between stages on one rank (`hands_to`) and the dxs that drop their
// session's replay for a second one before the dw (`drops_replay`).
// hpr-lower-runtime writes them onto the ops (Passes.td); verifyImportedPlan
// compares a plan read back with them. Action indices count a program's actions
// as the plan JSON lists them (sessions do not count).
//
//===----------------------------------------------------------------------===//

#ifndef HPR_ANALYSIS_RUNTIMELOWERING_H
#define HPR_ANALYSIS_RUNTIMELOWERING_H

#include "hpr/Dialect/HPR/HPROps.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <map>
#include <vector>

namespace mlir::hpr {

/// Op -> action indices of its program (`posts`, `waits`).
using ActionIndexLists =
    llvm::DenseMap<Operation *, llvm::SmallVector<int64_t>>;

/// The messages each rank sends to each peer, in its order: what
/// receivePosts matches a rank's receives against.
struct SendOrder {
  /// One message, seen from either end: forward or backward, the receiving
  /// stage, the microbatch, packed into one key (RuntimeLowering.cpp).
  using Message = uint64_t;
  /// (sender, receiver) -> the sender's messages to the receiver, in order.
  std::map<std::pair<int64_t, int64_t>, std::vector<Message>> sent;
};
SendOrder collectSendOrder(ScheduleOp schedule);

/// When each receive of `program` is posted (`posts`): torch's point-to-point
/// ops carry no tag, so two ranks match messages in posting order. A receive
/// is posted, in its peer's send order, together with every receive from that
/// peer that the peer sends before it, at the first of them a rank reaches
/// (earlier than its own place, never later); a receive the peer does not
/// send posts itself. Every receive has an entry, empty where an earlier one
/// posts it. [hpr.schedule.posts]
ActionIndexLists receivePosts(ProgramOp program, const SendOrder &sends);

/// Which action reads each receive of `program` (`waits`): a `recv_f`'s data
/// is the input of the forward of its stage and microbatch, a `recv_b`'s the
/// output gradient of the first `backward_input` or `backward` of its stage
/// and microbatch. Readers of no receive have no entry. [hpr.plan.waits]
ActionIndexLists receiveReaders(ProgramOp program);

/// The last backward of each (stage, microbatch) of `program`: where its
/// autograd graph is freed (`frees_graph`).
llvm::DenseSet<Operation *> lastConsumers(ProgramOp program);

/// The last `backward_weight` or `backward` of each stage of `program`:
/// where the stage's gradients are complete (`last_backward`; the "last
/// backward" of torch's stages, where DDP and FSDP reduce).
/// [hpr.plan.last-backward]
llvm::DenseSet<Operation *> lastBackwards(ProgramOp program);

/// The stage a forward's output (a backward_input's or backward's input
/// gradient) goes to, by sched::neighbourStage; outside [0, stages) at the
/// pipeline's ends.
int64_t resultStage(Operation *op);

/// Forward, backward_input or backward op of `program` -> the stage on the
/// same rank it hands its result to in memory (`hands_to`): its resultStage,
/// where that stage runs on the program's rank and no transfer carries it.
/// [hpr.plan.hands-to]
llvm::DenseMap<Operation *, int64_t> handoffs(ProgramOp program);

/// The backward_input of each session of `program` that an hpr.recompute
/// marked `for_weight` replays again for its dw (`drops_replay`): at the end
/// of that dx the runtime drops every tensor the session replayed.
/// [hpr.plan.drops-replay]
llvm::DenseSet<Operation *> replayDroppers(ProgramOp program);

/// The message tag of transfer `op` (`tag`): (sending stage, microbatch,
/// direction), the same number at both ends.
int64_t messageTag(Operation *op);

} // namespace mlir::hpr

#endif // HPR_ANALYSIS_RUNTIMELOWERING_H
