//===- Planner.cpp - Import, plan, verify: the planner as one call --------===//

#include "hpr/Driver/Planner.h"

#include "hpr/Model/ModelFile.h"
#include "hpr/Model/ModelJson.h"
#include "hpr/Model/Partition.h"
#include "hpr/Model/TorchScriptImport.h"
#include "hpr/Plan/BuildModule.h"
#include "hpr/Schedule/Generators.h"
#include "hpr/Schedule/Lowering.h"
#include "hpr/Schedule/ScheduleFile.h"
#include "hpr/Schedule/Validate.h"
#include "hpr/Support/OutputFile.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringExtras.h"

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

static llvm::Expected<sched::Schedule> loadSchedule(const PlanRequest &request,
                                                    std::string &name) {
  llvm::Expected<sched::Schedule> schedule =
      request.scheduleFile.empty()
          ? sched::generateSchedule(
                request.scheduleGen,
                {request.ranks, request.microbatches, request.stagesPerRank})
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

static llvm::Expected<model::StagedModel>
loadModel(const PlanRequest &request, int numStages,
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
    options.regionDepth = request.regionDepth;
    options.inputDtype = request.inputDtype;
    options.profile = request.profile;
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
  bool selective = request.checkpoint == CheckpointPolicy::Selective;
  bool everything = request.checkpoint == CheckpointPolicy::All ||
                    request.checkpoint == CheckpointPolicy::Auto || selective;
  if (everything || request.checkpoint == CheckpointPolicy::None)
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

llvm::Expected<PlannedModule>
mlir::hpr::runPlanner(MLIRContext &context, const PlanRequest &request,
                      TimingScope &timing, std::vector<std::string> *warnings) {
  if (!request.scheduleFile.empty() == !request.scheduleGen.empty())
    return usage("give one schedule: a file (--schedule) or a generator "
                 "(--schedule-gen)");
  RecomputePipelineOptions pipeline;
  if (!parsePrefetch(request.prefetch, pipeline))
    return usage("--prefetch: expected jit, lookahead=K or bubble, got '" +
                 request.prefetch + "'");
  if (request.budget && !request.budget->ofCheckpointAll &&
      request.budget->bytes < 0)
    return usage("--memory-budget: expected bytes >= 0, got " +
                 llvm::Twine(request.budget->bytes));
  for (auto [flag, count] : {std::pair{"--dp-shard", request.dpShard},
                             std::pair{"--dp-replicate", request.dpReplicate}})
    if (count && (*count < 1 || *count > model::kMaxDataParallel))
      return usage(llvm::Twine(flag) + ": expected an integer between 1 and " +
                   llvm::Twine(model::kMaxDataParallel) + ", got " +
                   llvm::Twine(*count));
  if (request.checkpoint == CheckpointPolicy::Auto) {
    if (!request.budget)
      return usage("--checkpoint auto needs --memory-budget");
    pipeline.select = CheckpointSelection::Auto;
  }
  // The schedule is validated before import (loadSchedule): the same rules
  // hpr-verify-comm would check on the IR again.
  pipeline.checkSchedule = false;
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
  if (request.dpShard)
    staged->dataParallel.shard = *request.dpShard;
  if (request.dpReplicate)
    staged->dataParallel.replicate = *request.dpReplicate;
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
  // Otherwise the budget is a check of the finished plan.
  if (budget && (request.checkpoint == CheckpointPolicy::Auto ||
                 pipeline.policy == RecomputePolicy::Bubble))
    pipeline.budget = *budget;

  auto planned = planModule(
      context, *staged, *schedule, scheduleFile, pipeline, importTimer, timing,
      [&] {
        // The diagnostics name the budget in bytes; say where they came from.
        if (std::string note = budgetNote(request, budget); !note.empty())
          emitRemark(UnknownLoc::get(&context)) << note;
      });
  if (!planned)
    return planned.takeError();
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
                                      checkpointPolicyName(request.checkpoint),
                                      budget, "hp-recompute-plan"}};
}
