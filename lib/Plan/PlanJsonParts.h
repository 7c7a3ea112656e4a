//===- PlanJsonParts.h - Pieces of the plan JSON shared by writers -*- C++ -*-//
//
// The members of the plan JSON that other plan formats repeat (the torch CSV's
// sidecar): the schedule, the model's stages, one session, one action. Private
// to lib/Plan.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_LIB_PLAN_PLANJSONPARTS_H
#define HPR_LIB_PLAN_PLANJSONPARTS_H

#include "hpr/Dialect/HPR/HPROps.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/SmallVector.h"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <variant>
#include <vector>

namespace mlir::hpr::plan_json {

/// Stage index -> the names of its checkpointed regions.
using CheckpointedRegions = std::map<int64_t, std::vector<std::string>>;

/// `/schedule`: name, sizes, stage_to_rank.
nlohmann::json scheduleJson(ScheduleOp schedule);
/// `/model`: its name and per stage its regions; fills `checkpointed`.
nlohmann::json modelJson(ModelOp model, CheckpointedRegions &checkpointed);
/// A member value of a plan action (forEachActionMember).
using ActionMemberValue =
    std::variant<int64_t, bool, llvm::StringRef, llvm::ArrayRef<int64_t>>;

/// Receive op -> the receives to post when it is reached (`posts` in the plan
/// JSON), as indices into its program's actions (sessions do not count), in
/// posting order.
using ReceivePosts = llvm::DenseMap<Operation *, llvm::SmallVector<int64_t>>;

/// When each receive of `schedule` is posted. torch's point-to-point ops
/// carry no tag, so two ranks match messages in posting order: a receive is
/// posted, in its peer's send order, together with every receive from that
/// peer that the peer sends before it, at the first of them a rank reaches
/// (earlier than its own place, never later). A receive the peer does not
/// send posts itself. The plan JSON writes it and the torch CSV writes its
/// RECV cells in this order. Where a receive carries `posts` (a plan read
/// back), every receive keeps what the plan says.
ReceivePosts receivePosts(ScheduleOp schedule);

/// Reader op -> the receives whose data it reads (`waits` in the plan JSON),
/// as indices into its program's actions.
using ReceiveReaders = llvm::DenseMap<Operation *, llvm::SmallVector<int64_t>>;

/// Which action reads each receive of `schedule`: a `recv_f`'s data is the
/// input of the forward of its stage and microbatch, a `recv_b`'s the output
/// gradient of the first `backward_input` or `backward` of its stage and
/// microbatch. A runtime posts receives where `posts` says and waits exactly
/// for what its action's `waits` lists.
ReceiveReaders receiveReaders(ScheduleOp schedule);

/// Forward, backward_input or backward op -> the stage on the same rank it
/// hands its result to in memory (`hands_to` in the plan JSON): the stage a
/// SEND_F (forward) or SEND_B (dx) would go to (sched::neighbourStage), where
/// that stage runs on the op's own rank and no transfer carries it.
using Handoffs = llvm::DenseMap<Operation *, int64_t>;
Handoffs handoffs(ScheduleOp schedule);
/// The stage a forward's output (a backward_input's or backward's input
/// gradient) goes to, by sched::neighbourStage; outside [0, stages) at the
/// pipeline's ends.
int64_t resultStage(Operation *op);

/// What the planner lowers into every plan's actions, besides the schedule:
/// when each receive is posted, which action waits for it, the last W or B
/// of each stage, the in-memory handoffs between co-located stages. Computed
/// once per plan (lowerActionMembers) and written by forEachActionMember.
struct LoweredMembers {
  ReceivePosts posts;
  ReceiveReaders waits;
  /// The last `backward_weight` or `backward` of each stage
  /// (lastBackwards).
  llvm::DenseSet<Operation *> lastBackwards;
  Handoffs handsTo;
};
LoweredMembers lowerActionMembers(ScheduleOp schedule);

/// Calls `member(key, value)` for each member of `op`'s element of
/// `/ranks/*/actions`, in order: the one definition of that object, which the
/// plan JSON streams and the torch CSV's sidecar builds (actionJson). The
/// lowered members (`posts`, `waits`, `last_backward`, `hands_to`) are
/// written when `lowered` is given.
void forEachActionMember(
    Operation *op, const llvm::DenseSet<Operation *> &lastConsumers,
    llvm::function_ref<void(llvm::StringRef, const ActionMemberValue &)> member,
    const LoweredMembers *lowered = nullptr);

/// One element of `/sessions`.
nlohmann::ordered_json sessionJson(SessionOp session,
                                   const CheckpointedRegions &checkpointed);
/// The last backward of each (stage, microbatch) of `program`: where its
/// autograd graph is freed (`frees_graph` in the plan JSON).
llvm::DenseSet<Operation *> lastConsumers(ProgramOp program);
/// The last `backward_weight` or `backward` of each stage of `program`: where
/// the stage's gradients are complete (`last_backward` in the plan JSON; the
/// "last backward" of torch's stages, where DDP and FSDP reduce).
llvm::DenseSet<Operation *> lastBackwards(ProgramOp program);
/// One element of `/ranks/R/actions`; `lastConsumers` marks `frees_graph`.
nlohmann::ordered_json
actionJson(Operation *op, const llvm::DenseSet<Operation *> &lastConsumers);

} // namespace mlir::hpr::plan_json

#endif // HPR_LIB_PLAN_PLANJSONPARTS_H
