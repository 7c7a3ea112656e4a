//===- BuildModule.h - Schedule + model -> hpr IR ---------------*- C++ -*-===//
//
// The importer: turns an in-memory schedule (already lowered, with its
// send/recv) and a staged model into an hpr module that the planning passes
// run on. It knows the formats' data model, not the passes.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_TARGET_BUILDMODULE_H
#define HPR_TARGET_BUILDMODULE_H

#include "hpr/Model/Model.h"
#include "hpr/Schedule/Schedule.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/Error.h"

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mlir::hpr {

/// What a plan adds to an action of its schedule, for a plan read back
/// (hpr/Target/PlanImport.h): the session it names, the consumer's
/// retain_on_unpack, and a forward that runs plainly.
struct PlannedAction {
  std::string session; ///< "" when it names none
  bool retainOnUnpack = false;
  bool plain = false;
  /// A recompute: replayed inside its backward (`in_backward`).
  bool inBackward = false;
  /// A recompute: the piece's checkpointed regions (`regions`); none when
  /// it replays them all.
  std::optional<std::vector<int64_t>> regions;
  /// A recompute: the replay for a dw (`for_weight`).
  bool forWeight = false;
  /// A backward_weight: its session is replayed again for it
  /// (`weight_replay`).
  bool weightReplay = false;
  /// A forward: the session its checkpoint handles are bound to ("" none).
  std::string binds;
};

/// A plan's sessions and per-action facts, beside the schedule that holds
/// its actions (RECOMPUTE and CLEAR included).
struct PlannedFacts {
  /// Session id -> its (stage, microbatch).
  std::map<std::string, std::pair<int, int>> sessions;
  /// actions[r][k]: rank r's k-th primitive action (composites' parts each
  /// count), in program order.
  std::vector<std::vector<PlannedAction>> actions;
};

/// Builds `module { hpr.model ...; hpr.schedule ... }`. Each action gets the
/// location `FILE:RANK+1:CELL+1`, so diagnostics of later passes point at the
/// schedule cell. Each program records its compute order digest. Fails when
/// the model's stage count differs from the schedule's or the schedule
/// already holds planner actions (RECOMPUTE, CLEAR).
///
/// With `planned`, the schedule is a finished plan read back: each forward
/// with a session is followed by its `hpr.session`, RECOMPUTE, CLEAR and the
/// backwards take the session they name, and each action is located at its
/// JSON path (`FILE: /ranks/R/actions/K`, a NameLoc around `FILE:R+1:K+1`).
/// An action naming a session its rank has not bound yet is an error there.
llvm::Expected<OwningOpRef<ModuleOp>>
buildPlanModule(MLIRContext &context, const model::StagedModel &model,
                const sched::Schedule &schedule, llvm::StringRef scheduleFile,
                const PlannedFacts *planned = nullptr);

/// A model whose every stage has one checkpointed region of unit cost: what
/// the planner assumes when only a schedule is given.
model::StagedModel makeUniformModel(int numStages);

} // namespace mlir::hpr

#endif // HPR_TARGET_BUILDMODULE_H
