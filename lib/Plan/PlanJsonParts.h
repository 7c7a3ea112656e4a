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

/// Calls `member(key, value)` for each member of `op`'s element of
/// `/ranks/*/actions`, in order: the one definition of that object, which the
/// plan JSON streams and the torch CSV's sidecar builds (actionJson). A
/// receive's `posts` is written when `posts` is given.
void forEachActionMember(
    Operation *op, const llvm::DenseSet<Operation *> &lastConsumers,
    llvm::function_ref<void(llvm::StringRef, const ActionMemberValue &)> member,
    const ReceivePosts *posts = nullptr);

/// One element of `/sessions`.
nlohmann::ordered_json sessionJson(SessionOp session,
                                   const CheckpointedRegions &checkpointed);
/// The last backward of each (stage, microbatch) of `program`: where its
/// autograd graph is freed (`frees_graph` in the plan JSON).
llvm::DenseSet<Operation *> lastConsumers(ProgramOp program);
/// One element of `/ranks/R/actions`; `lastConsumers` marks `frees_graph`.
nlohmann::ordered_json
actionJson(Operation *op, const llvm::DenseSet<Operation *> &lastConsumers);

} // namespace mlir::hpr::plan_json

#endif // HPR_LIB_PLAN_PLANJSONPARTS_H
