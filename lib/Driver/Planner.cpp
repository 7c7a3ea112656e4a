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
#include "llvm/Support/Format.h"

#include <cmath>

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
  double multiple;
  if (text.consume_back("x")) {
    if (text.getAsDouble(multiple) || !std::isfinite(multiple) || multiple <= 0)
      return std::nullopt;
    return MemoryBudget{0, multiple};
  }
  if (std::optional<int64_t> bytes = parseBytes(text))
    return MemoryBudget{*bytes, std::nullopt};
  return std::nullopt;
}

std::string MemoryBudget::str() const {
  if (!ofCheckpointAll)
    return std::to_string(bytes);
  std::string text;
  llvm::raw_string_ostream(text) << llvm::format("%gx", *ofCheckpointAll);
  return text;
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

/// The bytes `budget` stands for: itself, or its multiple of the most any
/// rank needs when `request` is planned with every checkpointable region
/// checkpointed and replayed jit (the same model, schedule, stages and data
/// parallelism).
static llvm::Expected<int64_t> resolveBudget(MLIRContext &context,
                                             const PlanRequest &request,
                                             TimingScope &timing,
                                             const MemoryBudget &budget) {
  if (!budget.ofCheckpointAll)
    return budget.bytes;
  PlanRequest reference = request;
  reference.checkpoint = CheckpointPolicy::All;
  reference.prefetch = "jit";
  reference.budget.reset();
  TimingScope referenceTimer = timing.nest("checkpoint-all peak");
  llvm::Expected<PlannedModule> planned =
      runPlanner(context, reference, referenceTimer, nullptr);
  if (!planned)
    return planned.takeError();
  int64_t peak = 0;
  for (const RankSummary &rank : planned->summary.ranks)
    peak = std::max(peak, rank.peakBytes);
  double bytes = std::floor(*budget.ofCheckpointAll * double(peak));
  if (bytes >= 0x1p63)
    return usage("--memory-budget " + budget.str() + ": " + llvm::Twine(peak) +
                 " bytes (the checkpoint-all peak) times it overflows");
  return int64_t(bytes);
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
  std::optional<int64_t> budget;
  if (request.budget) {
    llvm::Expected<int64_t> bytes =
        resolveBudget(context, request, timing, *request.budget);
    if (!bytes)
      return bytes.takeError();
    budget = *bytes;
  }
  // Otherwise the budget is a check of the finished plan.
  if (budget && (request.checkpoint == CheckpointPolicy::Auto ||
                 pipeline.policy == RecomputePolicy::Bubble))
    pipeline.budget = *budget;

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

  // Import creates a location per schedule cell; uniquing a million of them
  // is cheaper without the context's locks. Passes and export use threads.
  bool threaded = context.isMultithreadingEnabled();
  context.disableMultithreading();
  auto module = buildPlanModule(context, *staged, *schedule, scheduleFile);
  if (threaded)
    context.enableMultithreading();
  if (!module)
    return module.takeError();
  importTimer.stop();

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
    // The diagnostics name the budget in bytes; say where they came from.
    if (std::string note = budgetNote(request, budget); !note.empty())
      emitRemark(UnknownLoc::get(&context)) << note;
    return llvm::createStringError(
        scheduleFile + ": the plan failed verification (diagnostics above)");
  }
  passTimer.stop();

  TimingScope summaryTimer = timing.nest("summary and simulation");
  llvm::Expected<PlanSummary> summary = summarizePlan(**module);
  if (!summary)
    return summary.takeError();
  summaryTimer.stop();
  if (budget)
    for (auto [rank, rankSummary] : llvm::enumerate(summary->ranks))
      if (rankSummary.peakBytes > *budget)
        return llvm::createStringError(
            "plan exceeds --memory-budget: rank " + llvm::Twine(rank) +
            " needs " + llvm::Twine(rankSummary.peakBytes) +
            " bytes of activations, budget " + llvm::Twine(*budget) +
            (request.budget->ofCheckpointAll
                 ? " (" + budgetNote(request, budget) + ")"
                 : std::string()));

  return PlannedModule{std::move(*module), std::move(*summary),
                       PlannerOptions{request.prefetch,
                                      checkpointPolicyName(request.checkpoint),
                                      budget, "hp-recompute-plan"}};
}
