//===- Planner.h - Import, plan, verify: the planner as one call -*- C++
//-*-===//
//
// What `hp-recompute-plan` does between reading its flags and writing its
// outputs, as a function: read the schedule and the model, build the hpr
// module, run the planning passes, the structural verifier and hpr-verify,
// and summarize. The CLI and the Python bindings (hp_recompute.plan) both
// call it, so a plan made in process is the plan the CLI makes.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_DRIVER_PLANNER_H
#define HPR_DRIVER_PLANNER_H

#include "hpr/Model/Model.h"
#include "hpr/Schedule/Schedule.h"
#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Target/PlanJson.h"
#include "hpr/Target/PlanSummary.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/Support/Timing.h"
#include "llvm/Support/Error.h"

#include <optional>
#include <string>

namespace mlir::hpr {

/// What `--schedule-gen auto` plans, in the order ties go: every built-in
/// family but GPipe (docs/cli.md).
inline constexpr llvm::StringLiteral kAutoScheduleFamilies[] = {
    "1f1b", "interleaved-1f1b", "zb-h1", "interleaved-zb", "zbv", "dualpipev"};

/// Which regions to checkpoint (`--checkpoint`).
enum class CheckpointPolicy { All, Model, None, Auto, Selective };

/// The `--checkpoint` spelling of `policy`.
const char *checkpointPolicyName(CheckpointPolicy policy);
/// The policy spelled `name` (all, model, none, auto, selective); none when
/// unknown.
std::optional<CheckpointPolicy> parseCheckpointPolicy(llvm::StringRef name);

/// A per-rank activation budget (`--memory-budget`): bytes, or a multiple of
/// the checkpoint-all peak, the most any rank needs when every checkpointable
/// region is checkpointed and replayed jit (torch's checkpoint on every
/// block). runPlanner resolves a multiple by planning that first.
struct MemoryBudget {
  /// A decimal multiple, exact: numerator / 10^scale (`1.25x`: 125, 2).
  struct Multiple {
    int64_t numerator = 0;
    unsigned scale = 0;
  };
  int64_t bytes = 0;
  /// Set for a multiple; `bytes` is then unused.
  std::optional<Multiple> ofCheckpointAll;

  /// As written on the command line: `1048576` or `1.5x`.
  std::string str() const;
};

/// Parses `24GiB`, `512MB`, `1000` (bytes >= 0) or `1.5x` (a decimal
/// multiple > 0, `D+(.D+)?x`, at most 18 decimals); none when malformed.
std::optional<MemoryBudget> parseMemoryBudget(llvm::StringRef text);
/// What a malformed memory budget is told it should have been, after the
/// option's name (`--memory-budget: `).
inline constexpr llvm::StringLiteral kMemoryBudgetExpected =
    "expected bytes such as 24GiB, or a multiple of the checkpoint-all peak "
    "such as 1.5x";

/// How the caller of the planner writes its options, for messages.
enum class OptionSpelling {
  /// The CLI's flags: `--stages-per-rank`.
  Flag,
  /// Python's keyword arguments (hp_recompute.make_plan): `stages_per_rank=`.
  Keyword,
};

/// Option `flag` (the CLI's name: `stages-per-rank`) as `spelling` names it
/// in a message saying what its value should be: `--stages-per-rank`,
/// `stages_per_rank`.
std::string optionName(llvm::StringRef flag, OptionSpelling spelling);

/// Everything the planner is asked (the CLI's flags, docs/cli.md). An unset
/// optional, or an empty string, is an option not given; the planner applies
/// its default (docs/cli.md).
struct PlanRequest {
  /// The model: a file (.pt2, .pt, .ir, .json), or JSON text with a name
  /// for messages; with neither, every stage is one unit-cost checkpointed
  /// region (a schedule alone).
  std::string modelFile;
  std::string modelJsonText, modelJsonName;
  /// Models read from TorchScript or .pt2 (not JSON graphs): module depth
  /// of a region (1), input shapes, input dtype (float32), whether to
  /// measure forward times (no).
  std::optional<int> regionDepth;
  std::string inputShape;
  std::optional<std::string> inputDtype;
  std::optional<bool> profile;
  std::string stageSpec;
  /// All when not given.
  std::optional<CheckpointPolicy> checkpoint;

  /// The schedule: a file (.csv, .json) or a generator with its sizes
  /// (4 ranks, 8 microbatches, the schedule's own stages per rank); the
  /// generator `auto` plans each of kAutoScheduleFamilies within the budget
  /// and keeps the fastest plan (a budget multiple is then of 1F1B's
  /// checkpoint-all peak).
  std::string scheduleFile;
  std::string scheduleGen;
  std::optional<int64_t> ranks, microbatches, stagesPerRank;
  sched::CsvDialect csvDialect = sched::CsvDialect::Current;

  /// The data-parallel layout (`--dp-shard`, `--dp-replicate`): each given
  /// count replaces the model JSON's `data_parallel` one.
  std::optional<int64_t> dpShard, dpReplicate;

  /// Placement: jit, lookahead=K or bubble; the per-rank budget.
  std::string prefetch = "jit";
  std::optional<MemoryBudget> budget;

  /// How messages about this request name its options.
  OptionSpelling spelling = OptionSpelling::Flag;

  /// Lower the chosen plan for the runtimes (hpr-lower-runtime, once, after
  /// every contender is planned): what the plan JSON, its IR and torch's CSV
  /// print. An output that prints none of it (the summary, the schedule CSV,
  /// a trace, a picture) leaves it off.
  bool lowerRuntime = true;

  /// Refuses, as a UsageError, a request the planner would not read as
  /// given: no schedule or two; an option the chosen inputs do not read
  /// (sizes of a generated schedule beside a schedule file, options that
  /// shape a model without one, TorchScript options beside a JSON graph); a
  /// count or a placement out of its range. The rules of the CLI and of
  /// hp_recompute.make_plan, each written once here; runPlanner checks them
  /// first.
  llvm::Error validate() const;
};

/// A finished, verified plan (its names and sizes are the module's
/// hpr.model and hpr.schedule).
struct PlannedModule {
  OwningOpRef<ModuleOp> module;
  PlanSummary summary;
  /// The `planner` member of its plan JSON (with `--schedule-gen auto`, the
  /// schedules it planned).
  PlannerOptions options;
};

/// Plans `request`. Bad requests are UsageErrors; unreadable inputs and
/// plans over the budget are errors with their file and position. Pass and
/// verifier diagnostics go to `context`'s handler, and the result is then an
/// error saying the plan failed verification. `timing` nests the phases.
llvm::Expected<PlannedModule> runPlanner(MLIRContext &context,
                                         const PlanRequest &request,
                                         TimingScope &timing,
                                         std::vector<std::string> *warnings);

} // namespace mlir::hpr

#endif // HPR_DRIVER_PLANNER_H
