//===- PlanJsonParts.h - Pieces of the plan JSON shared by writers -*- C++ -*-//
//
// The members of the plan JSON that other plan formats repeat (the torch CSV's
// sidecar): the schedule, the model's stages, one session, one action. They
// print the module; nothing here derives what a runtime reads (that is
// hpr-lower-runtime's). Private to lib/Target.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_LIB_TARGET_PLANJSONPARTS_H
#define HPR_LIB_TARGET_PLANJSONPARTS_H

#include "hpr/Dialect/HPR/HPROps.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLFunctionalExtras.h"

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

/// Calls `member(key, value)` for each member of `op`'s element of
/// `/ranks/*/actions`, in order: the one definition of that object, which the
/// plan JSON streams and the torch CSV's sidecar builds (actionJson). It
/// prints what the op carries: a planned module is lowered
/// (hpr-lower-runtime), an imported one carries what its file says. With
/// `schedule` false, the members that place the action among the others
/// (`posts`, `waits`, `last_backward`, `hands_to`) are left out: the torch
/// CSV's cells and order say them.
void forEachActionMember(
    Operation *op,
    llvm::function_ref<void(llvm::StringRef, const ActionMemberValue &)> member,
    bool schedule = true);

/// One element of `/sessions`.
nlohmann::ordered_json sessionJson(SessionOp session,
                                   const CheckpointedRegions &checkpointed);
/// One element of `/ranks/R/actions`, without the members that place it
/// (forEachActionMember with `schedule` false): the torch CSV's sidecar.
nlohmann::ordered_json actionJson(Operation *op);

} // namespace mlir::hpr::plan_json

#endif // HPR_LIB_TARGET_PLANJSONPARTS_H
