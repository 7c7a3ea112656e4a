//===- Planner.cpp - Import, plan, verify: the planner as one call --------===//

#include "hpr/Driver/Planner.h"

#include "hpr/Model/ModelFile.h"
#include "hpr/Model/ModelJson.h"
#include "hpr/Model/Partition.h"
#include "hpr/Model/TorchScriptImport.h"
#include "hpr/Schedule/Generators.h"
#include "hpr/Schedule/Lowering.h"
#include "hpr/Schedule/ScheduleFile.h"
#include "hpr/Schedule/Validate.h"
#include "hpr/Support/OutputFile.h"
#include "hpr/Support/Rules.h"
#include "hpr/Target/BuildModule.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringExtras.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <tuple>

using namespace mlir;
using namespace mlir::hpr;

const char *mlir::hpr::checkpointPolicyName(CheckpointPolicy policy) {
  switch (policy) {
  case CheckpointPolicy::All:
    return "all";
  case CheckpointPolicy::Model:
    return "model";
  case CheckpointPolicy::None:
    return "none";
  case CheckpointPolicy::Auto:
    return "auto";
  case CheckpointPolicy::Selective:
    return "selective";
  }
  return "all";
}

std::optional<CheckpointPolicy>
mlir::hpr::parseCheckpointPolicy(llvm::StringRef name) {
  for (CheckpointPolicy policy :
       {CheckpointPolicy::All, CheckpointPolicy::Model, CheckpointPolicy::None,
        CheckpointPolicy::Auto, CheckpointPolicy::Selective})
    if (name == checkpointPolicyName(policy))
      return policy;
  return std::nullopt;
}

/// Parses `24GiB`, `512MB`, `1000`; none when malformed or negative.
static std::optional<int64_t> parseBytes(llvm::StringRef text) {
  static const std::pair<llvm::StringRef, int64_t> suffixes[] = {
      {"KiB", 1LL << 10},
      {"MiB", 1LL << 20},
      {"GiB", 1LL << 30},
      {"TiB", 1LL << 40},
      {"KB", 1000},
      {"MB", 1000000},
      {"GB", 1000000000},
      {"TB", 1000000000000LL},
      {"B", 1}};
  int64_t scale = 1;
  for (auto [suffix, factor] : suffixes)
    if (text.consume_back(suffix)) {
      scale = factor;
      break;
    }
  int64_t value, bytes;
  if (text.getAsInteger(10, value) || value < 0 ||
      __builtin_mul_overflow(value, scale, &bytes))
    return std::nullopt;
  return bytes;
}

std::optional<MemoryBudget> mlir::hpr::parseMemoryBudget(llvm::StringRef text) {
  if (!text.consume_back("x")) {
    if (std::optional<int64_t> bytes = parseBytes(text))
      return MemoryBudget{*bytes, std::nullopt};
    return std::nullopt;
  }
  // A decimal `D+(.D+)?`, kept exact: digits over a power of ten.
  auto [whole, fraction] = text.split('.');
  auto digits = [](llvm::StringRef part) {
    return !part.empty() &&
           llvm::all_of(part, [](char c) { return llvm::isDigit(c); });
  };
  if (!digits(whole) || (text.contains('.') && !digits(fraction)) ||
      fraction.size() > 18)
    return std::nullopt;
  MemoryBudget::Multiple multiple{0, static_cast<unsigned>(fraction.size())};
  for (char digit : (whole + fraction).str())
    if (__builtin_mul_overflow(multiple.numerator, 10, &multiple.numerator) ||
        __builtin_add_overflow(multiple.numerator, digit - '0',
                               &multiple.numerator))
      return std::nullopt;
  if (multiple.numerator == 0)
    return std::nullopt;
  return MemoryBudget{0, multiple};
}

std::string MemoryBudget::str() const {
  if (!ofCheckpointAll)
    return std::to_string(bytes);
  std::string text = std::to_string(ofCheckpointAll->numerator);
  unsigned scale = ofCheckpointAll->scale;
  if (scale) {
    if (text.size() <= scale)
      text.insert(0, scale + 1 - text.size(), '0');
    text.insert(text.size() - scale, ".");
  }
  return text + "x";
}

static llvm::Error usage(const llvm::Twine &message) {
  return llvm::make_error<UsageError>(message.str());
}

/// Parses `prefetch` into `options`; false when malformed.
static bool parsePrefetch(llvm::StringRef text,
                          RecomputePipelineOptions &options) {
  if (text == "jit" || text == "bubble") {
    options.policy =
        text == "jit" ? RecomputePolicy::Jit : RecomputePolicy::Bubble;
    return true;
  }
  unsigned distance;
  if (text.consume_front("lookahead=") && !text.getAsInteger(10, distance)) {
    options.policy = RecomputePolicy::Lookahead;
    options.distance = distance;
    return true;
  }
  return false;
}

//===----------------------------------------------------------------------===//
// The request's rules
//===----------------------------------------------------------------------===//

// The sizes of a generated schedule when not given (docs/cli.md); stages per
// rank default to the schedule's own (0 to the generator).
static constexpr int kDefaultRanks = 4, kDefaultMicrobatches = 8;

std::string mlir::hpr::optionName(llvm::StringRef flag,
                                  OptionSpelling spelling) {
  if (spelling == OptionSpelling::Flag)
    return (flag.size() == 1 ? "-" : "--") + flag.str();
  std::string name = flag.str();
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

namespace {
/// The options of one request as its caller gives them.
struct GivenOptions {
  OptionSpelling spelling;

  /// Option `flag` as given: `--stages-per-rank`, `stages_per_rank=`.
  std::string operator()(llvm::StringRef flag) const {
    std::string name = optionName(flag, spelling);
    return spelling == OptionSpelling::Flag ? name : name + "=";
  }
  /// Option `flag` given `value`: `--schedule s.csv`, `schedule='s.csv'`.
  std::string operator()(llvm::StringRef flag, llvm::StringRef value) const {
    return spelling == OptionSpelling::Flag
               ? (*this)(flag) + " " + value.str()
               : (*this)(flag) + "'" + value.str() + "'";
  }
};
} // namespace

llvm::Error PlanRequest::validate() const {
  GivenOptions given{spelling};
  auto name = [&](llvm::StringRef flag) { return optionName(flag, spelling); };
  if (!scheduleFile.empty() && !scheduleGen.empty())
    return usage(given("schedule") + " and " + given("schedule-gen") +
                 " are exclusive");
  if (scheduleFile.empty() && scheduleGen.empty())
    return usage("give one schedule: a file (" + given("schedule") +
                 ") or a generator (" + given("schedule-gen") + ")");
  if (scheduleGen == "auto" && !budget)
    return usage(given("schedule-gen", "auto") +
                 " chooses the fastest schedule within " +
                 given("memory-budget") + "; give one");
  if (scheduleGen == "auto" && stagesPerRank)
    return usage(given("stages-per-rank") + " does not apply to " +
                 given("schedule-gen", "auto") +
                 ": each schedule it plans takes its own");

  // Options the chosen inputs do not read are refused rather than ignored.
  // With a schedule but no model the model is the uniform one.
  std::pair<llvm::StringRef, bool> shapingModel[] = {
      {"region-depth", regionDepth.has_value()},
      {"input-shape", !inputShape.empty()},
      {"input-dtype", inputDtype.has_value()},
      {"profile", profile.has_value()},
      {"stages", !stageSpec.empty()},
      {"checkpoint", checkpoint.has_value()}};
  bool hasModel = !modelFile.empty() || !modelJsonText.empty();
  for (auto [flag, isGiven] : shapingModel)
    if (isGiven && !hasModel)
      return usage(given(flag) + " shapes a model; give one with " +
                   given("model") +
                   " (with a schedule alone, every stage is one unit-cost "
                   "checkpointed region)");
  // The first four are read from TorchScript only.
  bool jsonGraph = !modelJsonText.empty() ||
                   llvm::StringRef(modelFile).ends_with_insensitive(".json");
  for (auto [flag, isGiven] : llvm::ArrayRef(shapingModel).take_front(4))
    if (isGiven && jsonGraph)
      return usage(given(flag) + " applies to TorchScript models; " +
                   (modelJsonText.empty() ? modelFile : modelJsonName) +
                   " is a JSON graph with its own sizes and costs");
  std::tuple<llvm::StringRef, std::optional<int64_t>, llvm::StringRef> sizes[] =
      {{"ranks", ranks, ""},
       {"microbatches", microbatches, ""},
       {"stages-per-rank", stagesPerRank,
        " (leave it out for the schedule's default)"}};
  for (auto [flag, count, note] : sizes) {
    if (count && !scheduleFile.empty())
      return usage(given(flag) + " sizes a generated schedule; " +
                   given("schedule", scheduleFile) + " has its own");
    if (count && *count < 1)
      return usage(name(flag) + ": expected 1 or more" + note + ", got " +
                   llvm::Twine(*count));
    if (count && *count > std::numeric_limits<int>::max())
      return usage(name(flag) + ": expected at most " +
                   llvm::Twine(std::numeric_limits<int>::max()) + ", got " +
                   llvm::Twine(*count));
  }
  if (regionDepth && *regionDepth < 0)
    return usage(name("region-depth") + ": expected 0 or more, got " +
                 llvm::Twine(*regionDepth));
  for (auto [flag, count] :
       {std::pair{"dp-shard", dpShard}, std::pair{"dp-replicate", dpReplicate}})
    if (count && (*count < 1 || *count > model::kMaxDataParallel))
      return usage(name(flag) + ": expected an integer between 1 and " +
                   llvm::Twine(model::kMaxDataParallel) + ", got " +
                   llvm::Twine(*count));

  RecomputePipelineOptions placement;
  if (!parsePrefetch(prefetch, placement))
    return usage(name("prefetch") + ": expected jit, lookahead=K or bubble, " +
                 "got '" + prefetch + "'");
  if (budget && !budget->ofCheckpointAll && budget->bytes < 0)
    return usage(name("memory-budget") + ": expected bytes >= 0, got " +
                 llvm::Twine(budget->bytes));
  if (checkpoint == CheckpointPolicy::Auto && !budget)
    return usage(given("checkpoint", "auto") + " needs " +
                 given("memory-budget"));
  return llvm::Error::success();
}

//===----------------------------------------------------------------------===//
// Planning
//===----------------------------------------------------------------------===//

static llvm::Expected<sched::Schedule> loadSchedule(const PlanRequest &request,
                                                    std::string &name) {
  llvm::Expected<sched::Schedule> schedule =
      request.scheduleFile.empty()
          ? sched::generateSchedule(
                request.scheduleGen,
                {static_cast<int>(request.ranks.value_or(kDefaultRanks)),
                 static_cast<int>(
                     request.microbatches.value_or(kDefaultMicrobatches)),
                 static_cast<int>(request.stagesPerRank.value_or(0))})
          : sched::readScheduleFile(request.scheduleFile, request.csvDialect);
  name = request.scheduleFile.empty() ? "<" + request.scheduleGen + ">"
                                      : request.scheduleFile;
  if (!schedule)
    return schedule.takeError();
  // Validated as written, so that "action K" in a message is cell K of the
  // file; then send/recv are added where the file has none, and each stage's
  // REDUCE_GRAD where the file has none.
  if (llvm::Error error = sched::validateSchedule(*schedule, name))
    return error;
  sched::lowerCommunication(*schedule);
  sched::lowerReduceGrad(*schedule);
  return schedule;
}

/// The request's model split into `numStages` stages (the uniform one
/// without a model), before the request's data-parallel layout.
static llvm::Expected<model::StagedModel>
loadStages(const PlanRequest &request, int numStages,
           std::vector<std::string> *warnings) {
  bool fromText = !request.modelJsonText.empty();
  if (request.modelFile.empty() && !fromText)
    return makeUniformModel(numStages);
  llvm::Expected<model::ModelGraph> graph =
      [&]() -> llvm::Expected<model::ModelGraph> {
    if (fromText)
      return model::parseModelJson(request.modelJsonText,
                                   request.modelJsonName);
    model::TorchScriptOptions options;
    options.regionDepth = request.regionDepth.value_or(options.regionDepth);
    options.inputDtype = request.inputDtype.value_or(options.inputDtype);
    options.profile = request.profile.value_or(options.profile);
    if (!request.inputShape.empty()) {
      auto shapes = model::parseShapeList(request.inputShape);
      if (!shapes)
        return shapes.takeError();
      options.inputShapes = *shapes;
    }
    return model::readModelFile(request.modelFile, options, warnings);
  }();
  if (!graph)
    return graph.takeError();
  // `auto` starts from every candidate; hpr-select-checkpoints chooses.
  CheckpointPolicy policy = request.checkpoint.value_or(CheckpointPolicy::All);
  bool selective = policy == CheckpointPolicy::Selective;
  bool everything = policy == CheckpointPolicy::All ||
                    policy == CheckpointPolicy::Auto || selective;
  if (everything || policy == CheckpointPolicy::None)
    for (model::Region &region : graph->regions) {
      region.checkpoint = everything && region.checkpointable;
      region.selective = selective && region.checkpoint;
      // The selective policy has no cost fallback (docs/models.md).
      if (region.selective && region.selectiveReplayTimeUs <= 0)
        return llvm::createStringError(
            "--checkpoint selective: region '" + region.name +
            "' has no measured selective costs (selective_replay_time_us); "
            "measure them with python -m hp_recompute.costs (torch >= 2.4)");
    }
  return model::partitionModel(*graph, numStages, request.stageSpec);
}

/// The request's model as loadStages splits it, with `--dp-shard` and
/// `--dp-replicate` replacing the model JSON's layout where given.
static llvm::Expected<model::StagedModel>
loadModel(const PlanRequest &request, int numStages,
          std::vector<std::string> *warnings) {
  llvm::Expected<model::StagedModel> staged =
      loadStages(request, numStages, warnings);
  if (staged && request.dpShard)
    staged->dataParallel.shard = *request.dpShard;
  if (staged && request.dpReplicate)
    staged->dataParallel.replicate = *request.dpReplicate;
  return staged;
}

/// Builds the plan module of `staged` on `schedule` (timed in
/// `importTiming`), runs the planning passes `pipeline` asks for, verifies
/// and summarizes it; calls `onFailure` after the passes' diagnostics.
static llvm::Expected<std::pair<OwningOpRef<ModuleOp>, PlanSummary>>
planModule(MLIRContext &context, const model::StagedModel &staged,
           const sched::Schedule &schedule, llvm::StringRef scheduleFile,
           const RecomputePipelineOptions &pipeline, TimingScope &importTiming,
           TimingScope &timing, llvm::function_ref<void()> onFailure) {
  // Import creates a location per schedule cell; uniquing a million of them
  // is cheaper without the context's locks. Passes and export use threads.
  TimingScope buildTimer = importTiming.nest("module");
  bool threaded = context.isMultithreadingEnabled();
  context.disableMultithreading();
  auto module = buildPlanModule(context, staged, schedule, scheduleFile);
  if (threaded)
    context.enableMultithreading();
  if (!module)
    return module.takeError();
  buildTimer.stop();
  importTiming.stop();

  // The module is verified once, as planned, rather than after every pass
  // (a third of the run on large schedules); the importer builds from a
  // validated schedule, and op verifiers still point at its cells. The
  // structural verifier runs before hpr-verify, which assumes its invariants.
  TimingScope passTimer = timing.nest("passes");
  PassManager planning(&context);
  planning.enableVerifier(false);
  planning.enableTiming(passTimer);
  buildPlanningPasses(planning, pipeline);
  PassManager checking(&context);
  checking.enableVerifier(false);
  checking.enableTiming(passTimer);
  nestOnPrograms(checking).addPass(createHPRVerify());
  if (failed(planning.run(**module)) || failed(mlir::verify(**module)) ||
      failed(checking.run(**module))) {
    onFailure();
    return llvm::createStringError(
        scheduleFile + ": the plan failed verification (diagnostics above)");
  }
  passTimer.stop();

  TimingScope summaryTimer = timing.nest("summary and simulation");
  llvm::Expected<PlanSummary> summary = summarizePlan(**module);
  if (!summary)
    return summary.takeError();
  return std::pair{std::move(*module), std::move(*summary)};
}

/// The bytes a multiple of the checkpoint-all peak stands for: `staged` with
/// every checkpointable region checkpointed (fully) and replayed jit, on the
/// same schedule, stages and data parallelism; floor(multiple x its largest
/// rank peak), exactly.
static llvm::Expected<int64_t>
resolveMultiple(MLIRContext &context, const MemoryBudget &budget,
                model::StagedModel staged, const sched::Schedule &schedule,
                llvm::StringRef scheduleFile, TimingScope &timing) {
  for (model::Stage &stage : staged.stages)
    for (model::Region &region : stage.regions) {
      region.checkpoint = region.checkpointable;
      region.selective = false;
    }
  RecomputePipelineOptions jit;
  jit.checkSchedule = false;
  jit.lowerRuntime = false; // only its peak is read
  TimingScope referenceTimer = timing.nest("checkpoint-all peak");
  TimingScope importTimer = referenceTimer.nest("import");
  auto reference = planModule(
      context, staged, schedule, scheduleFile, jit, importTimer, referenceTimer,
      [&] {
        emitRemark(UnknownLoc::get(&context))
            << "while planning every checkpointable region checkpointed, for "
               "--memory-budget "
            << budget.str();
      });
  if (!reference)
    return reference.takeError();
  int64_t peak = 0;
  for (const RankSummary &rank : reference->second.ranks)
    peak = std::max(peak, rank.peakBytes);
  unsigned __int128 bytes =
      static_cast<unsigned __int128>(peak) * budget.ofCheckpointAll->numerator;
  for (unsigned i = 0; i < budget.ofCheckpointAll->scale; ++i)
    bytes /= 10;
  if (bytes > static_cast<unsigned __int128>(INT64_MAX))
    return usage("--memory-budget " + budget.str() + ": " + llvm::Twine(peak) +
                 " bytes (the checkpoint-all peak) times it overflows");
  return static_cast<int64_t>(bytes);
}

/// The lower dw-deferral bounds planned beside the budget's own, in percent
/// of the budget.
static constexpr unsigned kDeferralBudgetPercents[] = {85, 70, 55, 40};
/// The same bounds and the budget's own, planned without weight replays.
static constexpr unsigned kWeightReplayFreePercents[] = {100, 85, 70, 55, 40};

/// Whether `schedule` splits backwards into dx and dw (its dws are the
/// ones hpr-bound-weight-deferral may run earlier).
static bool hasWeightActions(const sched::Schedule &schedule) {
  std::function<bool(const sched::Action &)> isWeight =
      [&](const sched::Action &action) {
        return action.kind == sched::ActionKind::BackwardWeight ||
               llvm::any_of(action.parts, isWeight);
      };
  return llvm::any_of(schedule.ranks, [&](const auto &program) {
    return llvm::any_of(program, isWeight);
  });
}

/// The warning `--memory-budget` earns on a model that does not say what a
/// dx keeps for its dw: empty where `schedule` splits no backward or every
/// region with parameters past the first stage (whose dx computes nothing)
/// has `bwd_weight_input_bytes` (hpr.split.weight-input-unknown).
static std::string weightInputWarning(const model::StagedModel &staged,
                                      const sched::Schedule &schedule) {
  if (!hasWeightActions(schedule))
    return "";
  std::vector<std::string> unknown;
  for (const model::Stage &stage : llvm::drop_begin(staged.stages))
    for (const model::Region &region : stage.regions)
      if (region.paramBytes > 0 && region.bwdWeightInputBytes == 0)
        unknown.push_back(region.name);
  if (unknown.empty())
    return "";
  std::string names = "'" + unknown.front() + "'";
  if (unknown.size() > 1)
    names += " and " + std::to_string(unknown.size() - 1) + " other region" +
             (unknown.size() > 2 ? "s" : "");
  return "--memory-budget bounds dx/dw pairs, but model '" + staged.name +
         "' does not say what a dx keeps for its dw (bwd_weight_input_bytes) "
         "for " +
         names +
         ": the plan counts nothing held from a dx to its dw there, so its "
         "peaks may be too low; export the model with python -m "
         "hp_recompute.export or measure it with python -m "
         "hp_recompute.costs " +
         std::string(ruleTag(Rule::SplitWeightInputUnknown));
}

/// Whether two warnings say the same: equal, or citing the same rule (a
/// rule's warning names what each family's stages make of the model).
static bool sameWarning(llvm::StringRef a, llvm::StringRef b) {
  if (a == b)
    return true;
  size_t tagA = a.rfind(" [hpr."), tagB = b.rfind(" [hpr.");
  return tagA != llvm::StringRef::npos && tagB != llvm::StringRef::npos &&
         a.ends_with("]") && a.substr(tagA) == b.substr(tagB);
}

/// For messages about a budget given as a multiple: what it resolved to;
/// empty for bytes.
static std::string budgetNote(const PlanRequest &request,
                              std::optional<int64_t> bytes) {
  if (!request.budget || !request.budget->ofCheckpointAll || !bytes)
    return "";
  return "--memory-budget " + request.budget->str() + " is " +
         std::to_string(*bytes) +
         " bytes, that multiple of the checkpoint-all peak";
}

/// Plans a validated request for one schedule.
static llvm::Expected<PlannedModule>
planSchedule(MLIRContext &context, const PlanRequest &request,
             TimingScope &timing, std::vector<std::string> *warnings) {
  RecomputePipelineOptions pipeline;
  (void)parsePrefetch(request.prefetch, pipeline); // validated
  CheckpointPolicy policy = request.checkpoint.value_or(CheckpointPolicy::All);
  if (policy == CheckpointPolicy::Auto)
    pipeline.select = CheckpointSelection::Auto;
  // The schedule is validated before import (loadSchedule): the same rules
  // hpr-verify-comm would check on the IR again. runPlanner lowers the plan
  // it returns, once.
  pipeline.checkSchedule = false;
  pipeline.lowerRuntime = false;
  TimingScope importTimer = timing.nest("import");
  TimingScope scheduleTimer = importTimer.nest("schedule");
  std::string scheduleFile; // what diagnostics name: the file or <generator>
  llvm::Expected<sched::Schedule> schedule =
      loadSchedule(request, scheduleFile);
  if (!schedule)
    return schedule.takeError();
  scheduleTimer.stop();
  TimingScope modelTimer = importTimer.nest("model");
  llvm::Expected<model::StagedModel> staged =
      loadModel(request, schedule->numStages, warnings);
  if (!staged)
    return staged.takeError();
  modelTimer.stop();

  std::optional<int64_t> budget;
  if (request.budget && request.budget->ofCheckpointAll) {
    // Timed within the import: an input of this plan, like the model.
    llvm::Expected<int64_t> bytes =
        resolveMultiple(context, *request.budget, *staged, *schedule,
                        scheduleFile, importTimer);
    if (!bytes)
      return bytes.takeError();
    budget = *bytes;
  } else if (request.budget) {
    budget = request.budget->bytes;
  }
  // The planning passes fit within it (dw deferral always; the checkpoint
  // choice with auto, the placement with bubble), and the finished plan is
  // checked against it.
  if (budget)
    pipeline.budget = *budget;
  if (budget && warnings)
    if (std::string warning = weightInputWarning(*staged, *schedule);
        !warning.empty())
      warnings->push_back(std::move(warning));

  auto plan = [&](const RecomputePipelineOptions &options) {
    return planModule(context, *staged, *schedule, scheduleFile, options,
                      importTimer, timing, [&] {
                        // The diagnostics name the budget in bytes; say where
                        // they came from.
                        if (std::string note = budgetNote(request, budget);
                            !note.empty())
                          emitRemark(UnknownLoc::get(&context)) << note;
                      });
  };
  // The bound takes weight replays greedily and does not go back on one: a
  // replay can leave a peak no dw change reaches where fusing would have
  // fitted. So where the plan with them fails, the plan without them is the
  // answer (and its diagnostics, if it fails too).
  bool replayable = pipeline.budget > 0 && pipeline.weightReplay &&
                    hasWeightActions(*schedule);
  auto planned = [&] {
    if (!replayable)
      return plan(pipeline);
    {
      ScopedDiagnosticHandler quiet(&context,
                                    [](Diagnostic &) { return success(); });
      auto withReplays = plan(pipeline);
      if (withReplays)
        return withReplays;
      llvm::consumeError(withReplays.takeError());
    }
    RecomputePipelineOptions without;
    without.copyOptionValuesFrom(pipeline);
    without.weightReplay = false;
    return plan(without);
  }();
  if (!planned)
    return planned.takeError();
  if (pipeline.budget > 0 && hasWeightActions(*schedule)) {
    // Bounding dw deferral at the budget leaves the checkpoint choice and
    // the placement only what is left; running dws earlier than they must
    // leaves them more. Each lower bound is planned too (its diagnostics
    // dropped: a bound below what the schedule reaches fails), and the
    // fastest plan wins; on a tie, the one bounded at the budget. The bound
    // chooses weight replays greedily, by a step priced with every replay
    // jit, so where a plan has any, every bound is planned again without
    // them, and the fastest of all wins: the lever never makes a plan
    // slower.
    ScopedDiagnosticHandler quiet(&context,
                                  [](Diagnostic &) { return success(); });
    bool replayed = planned->second.total().weightReplays > 0;
    auto contend = [&](unsigned percent, bool weightReplay,
                       bool fuseWeights = false) {
      RecomputePipelineOptions lower;
      lower.copyOptionValuesFrom(pipeline);
      lower.checkSchedule = false;
      lower.lowerRuntime = false;
      lower.deferralBudget = pipeline.budget * percent / 100;
      lower.weightReplay = weightReplay;
      lower.fuseWeights = fuseWeights;
      TimingScope lowerImport = timing.nest("import (lower dw bound)");
      auto contender = planModule(context, *staged, *schedule, scheduleFile,
                                  lower, lowerImport, timing, [] {});
      if (!contender) {
        llvm::consumeError(contender.takeError());
        return;
      }
      replayed |= contender->second.total().weightReplays > 0;
      if (contender->second.simulation.makespan <
          planned->second.simulation.makespan)
        planned = std::move(contender);
    };
    for (unsigned percent : kDeferralBudgetPercents)
      contend(percent, /*weightReplay=*/true);
    // Every dx fused with its dw first: the schedule the dws are deferred
    // from (ZB-H1's is 1F1B's), then dws back into idle time where the
    // choice leaves room, so a zero-bubble plan is never slower than its
    // schedule fused.
    contend(100, /*weightReplay=*/true, /*fuseWeights=*/true);
    if (replayed)
      for (unsigned percent : kWeightReplayFreePercents)
        contend(percent, /*weightReplay=*/false);
  }
  auto &[module, summary] = *planned;
  if (budget)
    for (auto [rank, rankSummary] : llvm::enumerate(summary.ranks))
      if (rankSummary.peakBytes > *budget)
        return llvm::createStringError(
            "plan exceeds --memory-budget: rank " + llvm::Twine(rank) +
            " needs " + llvm::Twine(rankSummary.peakBytes) +
            " bytes of activations, budget " + llvm::Twine(*budget) +
            (request.budget->ofCheckpointAll
                 ? " (" + budgetNote(request, budget) + ")"
                 : std::string()));

  return PlannedModule{std::move(module), std::move(summary),
                       PlannerOptions{request.prefetch,
                                      checkpointPolicyName(policy),
                                      budget,
                                      "hp-recompute-plan",
                                      {}}};
}

/// `--schedule-gen auto`: plans `request` with each of kAutoScheduleFamilies
/// (each failure's diagnostics kept as its refusal, not reported) and keeps
/// the plan whose simulated step is shortest (ties: the earlier family). A
/// budget multiple is resolved once, against 1F1B's checkpoint-all peak.
static llvm::Expected<PlannedModule>
planFastestSchedule(MLIRContext &context, const PlanRequest &request,
                    TimingScope &timing, std::vector<std::string> *warnings) {
  PlanRequest each = request;
  if (request.budget->ofCheckpointAll) {
    each.scheduleGen = "1f1b";
    std::string scheduleFile;
    TimingScope resolveTimer = timing.nest("checkpoint-all peak of 1f1b");
    llvm::Expected<sched::Schedule> schedule = loadSchedule(each, scheduleFile);
    if (!schedule)
      return schedule.takeError();
    llvm::Expected<model::StagedModel> staged =
        loadModel(each, schedule->numStages, warnings);
    if (!staged)
      return staged.takeError();
    llvm::Expected<int64_t> bytes =
        resolveMultiple(context, *request.budget, *staged, *schedule,
                        scheduleFile, resolveTimer);
    if (!bytes)
      return bytes.takeError();
    each.budget = MemoryBudget{*bytes, std::nullopt};
  }
  std::optional<PlannedModule> best;
  std::vector<ScheduleCandidate> candidates;
  for (llvm::StringRef family : kAutoScheduleFamilies) {
    each.scheduleGen = family.str();
    ScheduleCandidate &candidate = candidates.emplace_back();
    candidate.schedule = each.scheduleGen;
    std::string firstError;
    ScopedDiagnosticHandler capture(&context, [&](Diagnostic &diagnostic) {
      if (firstError.empty() &&
          diagnostic.getSeverity() == DiagnosticSeverity::Error)
        firstError = diagnostic.str();
      return success();
    });
    TimingScope familyTimer = timing.nest(each.scheduleGen);
    // Each family's warnings, each said once (the model's are every
    // family's).
    std::vector<std::string> familyWarnings;
    llvm::Expected<PlannedModule> planned =
        planSchedule(context, each, familyTimer, &familyWarnings);
    if (warnings)
      for (std::string &warning : familyWarnings)
        if (llvm::none_of(*warnings, [&](const std::string &said) {
              return sameWarning(said, warning);
            }))
          warnings->push_back(std::move(warning));
    if (!planned) {
      std::string error = llvm::toString(planned.takeError());
      candidate.refusal = firstError.empty() ? error : firstError;
      continue;
    }
    candidate.stepUs = planned->summary.simulation.makespan;
    for (const RankSummary &rank : planned->summary.ranks)
      candidate.peakBytes.push_back(rank.peakBytes);
    if (!best || *candidate.stepUs < best->summary.simulation.makespan)
      best = std::move(*planned);
  }
  if (!best) {
    std::string reasons;
    for (const ScheduleCandidate &candidate : candidates)
      reasons += "\n  " + candidate.schedule + ": " + candidate.refusal;
    return llvm::createStringError(
        optionName("schedule-gen", request.spelling) +
        " auto: no schedule plans within " +
        optionName("memory-budget", request.spelling) + " " +
        std::to_string(each.budget->bytes) + " bytes:" + reasons);
  }
  best->options.scheduleCandidates = std::move(candidates);
  return std::move(*best);
}

llvm::Expected<PlannedModule>
mlir::hpr::runPlanner(MLIRContext &context, const PlanRequest &request,
                      TimingScope &timing, std::vector<std::string> *warnings) {
  if (llvm::Error error = request.validate())
    return error;
  llvm::Expected<PlannedModule> planned =
      request.scheduleGen == "auto"
          ? planFastestSchedule(context, request, timing, warnings)
          : planSchedule(context, request, timing, warnings);
  if (!planned || !request.lowerRuntime)
    return planned;
  // Last, on the chosen plan alone: what the runtimes read.
  TimingScope lowerTimer = timing.nest("lower for the runtimes");
  PassManager lowering(&context);
  lowering.enableVerifier(false);
  lowering.enableTiming(lowerTimer);
  lowering.addPass(createHPRLowerRuntime());
  if (failed(lowering.run(*planned->module)))
    return llvm::createStringError("lowering the plan for the runtimes failed "
                                   "(diagnostics above)");
  return planned;
}
