//===- PlanExport.cpp - Planned hpr IR -> plan formats -------------------===//

#include "hpr/Plan/PlanExport.h"
#include "PlanJsonParts.h"

#include "hpr/Analysis/ActivationModel.h"
#include "hpr/Analysis/Timeline.h"

#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Model/Model.h"
#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/Simulate.h"
#include "hpr/Support/Json.h"

#include "mlir/IR/Threading.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Format.h"

#include <algorithm>
#include <optional>

using namespace mlir;
using namespace mlir::hpr;
namespace sched = ::hpr::sched;
using nlohmann::json;
/// Per-action and per-session objects keep their keys in insertion order
/// (`op` first), which also makes them cheaper to build than sorted maps.
using ordered_json = nlohmann::ordered_json;

using namespace mlir::hpr::plan_json;

ScheduleOp mlir::hpr::plan_json::getSchedule(ModuleOp module) {
  return *module.getOps<ScheduleOp>().begin();
}
ModelOp mlir::hpr::plan_json::getModel(ModuleOp module) {
  return *module.getOps<ModelOp>().begin();
}

//===----------------------------------------------------------------------===//
// Summary
//===----------------------------------------------------------------------===//

/// Counts and the peak memory of one program under the cost model.
static RankSummary summarizeProgram(ProgramOp program,
                                    const std::vector<StageCost> &costs) {
  RankSummary summary;
  ProgramActivations activations = collectActivationLifetimes(program);
  ActivationProfile profile = computeActivationProfile(activations, costs);
  summary.peakBytes = profile.peak();
  summary.maxLiveSessions = countMaxLiveReplays(activations);
  // Where each (stage, mb)'s output and its gradient die: its last backward.
  std::vector<char> isLastBackward(activations.numPositions, false);
  for (const ActivationLifetime &lifetime : activations.lifetimes)
    if (lifetime.hasConsumers)
      isLastBackward[lifetime.lastConsumerPos] = true;

  // Beyond activations (CostModel.h, "step memory"): stage outputs and their
  // gradients until the last backward, I's state until W, weight gradients
  // from the stage's first W or B to the end of the step (and a second copy
  // while a later W or B adds its gradients in).
  int64_t other = 0;
  llvm::DenseSet<int64_t> gradsAllocated;
  int64_t lastStage = static_cast<int64_t>(costs.size()) - 1;
  ArrayRef<int64_t> stageToRank =
      program->getParentOfType<ScheduleOp>().getStageToRank();
  auto rank = static_cast<int64_t>(program.getRank());
  unsigned pos = 0;
  for (Operation &op : program.getBody().getOps()) {
    int64_t live = profile.live[pos++];
    if (auto session = dyn_cast<SessionOp>(op)) {
      ++summary.sessions;
      for (Operation *user : session.getSession().getUsers())
        summary.perBackwardRecomputes += isa<ConsumerOpInterface>(user);
      continue;
    }
    ++summary.actions;
    auto action = cast<ActionOpInterface>(op);
    int64_t stage = action.getStageIndex();
    if (isa<ForwardOp, RecvBOp>(op)) {
      other += costs[stage].outputBytes;
    } else if (isa<RecomputeOp>(op)) {
      ++summary.recomputes;
    } else if (isa<ClearOp>(op)) {
      ++summary.clears;
    }
    if (isa<BackwardInputOp>(op))
      other += costs[stage].weightStateBytes;
    // dx handed to a co-located previous stage becomes its output gradient.
    bool producesDx = isa<BackwardInputOp, BackwardOp>(op) && stage > 0;
    if (producesDx && stageToRank[stage - 1] == rank)
      other += costs[stage - 1].outputBytes;
    summary.peakMemoryBytes = std::max(summary.peakMemoryBytes, live + other);
    if (!isa<ConsumerOpInterface>(op))
      continue;
    summary.peakMemoryBytes = std::max(
        summary.peakMemoryBytes, live + other + costs[stage].workspaceBytes);
    // What the backward frees as it goes: I's state (W), and on the last
    // consumer the microbatch's activations and replayed tensors (read
    // without retaining), its output and the output's gradient.
    if (isa<BackwardWeightOp>(op))
      other -= costs[stage].weightStateBytes;
    if (isLastBackward[pos - 1])
      other -= costs[stage].outputBytes * (stage == lastStage ? 0 : 2);
    // Weight gradients come last: the stage's first W or B allocates them
    // for the rest of the step, each later one computes a fresh copy before
    // adding it in.
    int64_t transient = 0;
    if (isa<BackwardWeightOp, BackwardOp>(op)) {
      if (gradsAllocated.insert(stage).second)
        other += costs[stage].gradBytes;
      else
        transient = costs[stage].gradBytes;
    }
    summary.peakMemoryBytes =
        std::max(summary.peakMemoryBytes,
                 live - profile.endingAt[pos - 1] + other + transient);
  }
  return summary;
}

RankSummary PlanSummary::total() const {
  RankSummary sum;
  for (const RankSummary &rank : ranks) {
    sum.actions += rank.actions;
    sum.sessions += rank.sessions;
    sum.recomputes += rank.recomputes;
    sum.clears += rank.clears;
    sum.perBackwardRecomputes += rank.perBackwardRecomputes;
    sum.maxLiveSessions = std::max(sum.maxLiveSessions, rank.maxLiveSessions);
    sum.peakBytes = std::max(sum.peakBytes, rank.peakBytes);
    sum.peakMemoryBytes = std::max(sum.peakMemoryBytes, rank.peakMemoryBytes);
    sum.hiddenRecomputeUs += rank.hiddenRecomputeUs;
    sum.exposedRecomputeUs += rank.exposedRecomputeUs;
  }
  return sum;
}

llvm::Expected<PlanSummary> mlir::hpr::summarizePlan(ModuleOp module) {
  std::vector<StageCost> costs = computeStageCosts(getModel(module));
  PlanSummary summary;
  for (ProgramOp program : getSchedule(module).getBody().getOps<ProgramOp>())
    summary.ranks.push_back(summarizeProgram(program, costs));
  summary.timeline = extractSchedule(module, costs);
  llvm::Expected<sched::SimulationResult> simulation =
      simulateTimeline(summary.timeline.schedule);
  if (!simulation)
    return simulation.takeError();
  summary.simulation = std::move(*simulation);
  for (auto [rank, exposure] : llvm::enumerate(measureRecomputeExposure(
           summary.timeline.schedule, summary.simulation))) {
    summary.ranks[rank].hiddenRecomputeUs = exposure.hiddenUs;
    summary.ranks[rank].exposedRecomputeUs = exposure.exposedUs;
  }
  return summary;
}

void mlir::hpr::printSummaryTable(const PlanSummary &summary,
                                  llvm::raw_ostream &os) {
  auto row = [&os](llvm::StringRef label, const RankSummary &rank) {
    os << llvm::format(
        "%-6s %8lld %8lld %10lld %12lld %9lld %14lld %12.1f %12.1f\n",
        label.str().c_str(), (long long)rank.actions, (long long)rank.sessions,
        (long long)rank.recomputes, (long long)rank.perBackwardRecomputes,
        (long long)rank.maxLiveSessions, (long long)rank.peakBytes,
        rank.hiddenRecomputeUs, rank.exposedRecomputeUs);
  };
  os << "rank    actions sessions recomputes per-backward  max-live     "
        "peak-bytes    hidden-us   exposed-us\n";
  for (auto [index, rank] : llvm::enumerate(summary.ranks))
    row(std::to_string(index), rank);
  row("total", summary.total());
  os << llvm::format("step time %.1f us, bubble fraction %.3f\n",
                     summary.simulation.makespan,
                     summary.simulation.bubbleFraction);
}

//===----------------------------------------------------------------------===//
// Plan JSON
//===----------------------------------------------------------------------===//

static json regionJson(RegionOp region) {
  json entry = {{"name", region.getName().str()},
                {"checkpoint", region.getCheckpoint()},
                {"checkpointable", !region.getNonCheckpointable()},
                {"fwd_flops", region.getFwdFlops().convertToDouble()},
                {"fwd_time_us", region.getFwdTimeUs().convertToDouble()},
                {"saved_bytes", static_cast<int64_t>(region.getSavedBytes())},
                {"input_bytes", static_cast<int64_t>(region.getInputBytes())},
                {"param_bytes", static_cast<int64_t>(region.getParamBytes())}};
  for (const ::hpr::model::MeasuredTime &time : ::hpr::model::kMeasuredTimes)
    if (auto value = region->getAttrOfType<FloatAttr>(time.key))
      entry[time.key] = value.getValueAsDouble();
  for (const ::hpr::model::MeasuredBytes &bytes : ::hpr::model::kMeasuredBytes)
    if (auto value = region->getAttrOfType<IntegerAttr>(bytes.key))
      entry[bytes.key] = value.getInt();
  return entry;
}

llvm::DenseSet<Operation *>
mlir::hpr::plan_json::lastConsumers(ProgramOp program) {
  llvm::DenseMap<std::pair<int64_t, int64_t>, Operation *> last;
  for (Operation &op : program.getBody().getOps())
    if (isa<ConsumerOpInterface>(op)) {
      auto action = cast<ActionOpInterface>(op);
      last[{action.getStageIndex(), action.getMicrobatchIndex()}] = &op;
    }
  llvm::DenseSet<Operation *> ops;
  for (auto &entry : last)
    ops.insert(entry.second);
  return ops;
}

/// The message tag of a transfer: (sending stage, microbatch, direction),
/// the same number at both ends.
static int64_t messageTag(Operation *op, int64_t stage, int64_t microbatch) {
  bool forward = isa<SendFOp, RecvFOp>(op);
  int64_t sender = stage;
  if (isa<RecvFOp>(op))
    sender = stage - 1;
  if (isa<RecvBOp>(op))
    sender = stage + 1;
  int64_t microbatches = op->getParentOfType<ScheduleOp>().getNumMicrobatches();
  return (sender * microbatches + microbatch) * 2 + (forward ? 0 : 1);
}

ordered_json mlir::hpr::plan_json::actionJson(
    Operation *op, const llvm::DenseSet<Operation *> &lastConsumers) {
  auto action = cast<ActionOpInterface>(op);
  ordered_json entry = {{"op", action.getPlanName().str()}};
  if (action.getStageIndex() >= 0)
    entry["stage"] = action.getStageIndex();
  if (action.getMicrobatchIndex() >= 0)
    entry["microbatch"] = action.getMicrobatchIndex();
  llvm::TypeSwitch<Operation *>(op)
      .Case<RecomputeOp, ClearOp>([&](auto sessionAction) {
        entry["session"] = sessionAction.getSessionOp().getSid().str();
      })
      .Case<SendFOp, RecvFOp, SendBOp, RecvBOp>([&](auto comm) {
        entry["peer"] = static_cast<int64_t>(comm.getPeer());
        entry["tag"] =
            messageTag(op, action.getStageIndex(), action.getMicrobatchIndex());
        if (comm.getBatched())
          entry["batched"] = true;
      });
  if (auto consumer = dyn_cast<ConsumerOpInterface>(op))
    if (Value session = consumer.getSessionValue()) {
      entry["session"] = session.getDefiningOp<SessionOp>().getSid().str();
      entry["retain_on_unpack"] = consumer.getRetainOnUnpackFlag();
    }
  if (lastConsumers.contains(op))
    entry["frees_graph"] = true;
  if (isOverlapped(op))
    entry["overlap"] = true;
  if (auto forward = dyn_cast<ForwardOp>(op))
    if (forward.getNoCheckpoint())
      entry["checkpoint"] = false;
  return entry;
}

/// Writes `items` as a JSON array, one compact element per line, so a plan
/// of a million actions streams out without a document-sized DOM.
template <typename Range, typename ToJson>
static void writeArrayLines(llvm::raw_ostream &os, const Range &items,
                            ToJson toJson, llvm::StringRef indent) {
  os << "[";
  bool first = true;
  for (auto &&item : items) {
    auto value = toJson(item);
    if (!value)
      continue;
    os << (first ? "\n" : ",\n") << indent << ::hpr::dumpJson(*value);
    first = false;
  }
  os << "\n" << indent.drop_back() << "]";
}

json mlir::hpr::plan_json::scheduleJson(ScheduleOp schedule) {
  return {
      {"name", schedule.getName().str()},
      {"num_ranks", static_cast<int64_t>(schedule.getNumRanks())},
      {"num_stages", static_cast<int64_t>(schedule.getNumStages())},
      {"num_microbatches", static_cast<int64_t>(schedule.getNumMicrobatches())},
      {"stage_to_rank", std::vector<int64_t>(schedule.getStageToRank())}};
}

json mlir::hpr::plan_json::modelJson(ModelOp model,
                                     CheckpointedRegions &checkpointed) {
  json stages = json::array();
  for (StageOp stage : model.getBody().getOps<StageOp>()) {
    json regions = json::array();
    for (RegionOp region : stage.getBody().getOps<RegionOp>()) {
      regions.push_back(regionJson(region));
      if (region.getCheckpoint())
        checkpointed[stage.getIndex()].push_back(region.getName().str());
    }
    stages.push_back({{"stage", static_cast<int64_t>(stage.getIndex())},
                      {"regions", std::move(regions)}});
  }
  return {{"name", model.getName().str()}, {"stages", std::move(stages)}};
}

ordered_json
mlir::hpr::plan_json::sessionJson(SessionOp session,
                                  const CheckpointedRegions &checkpointed) {
  ForwardOp forward = session.getForward();
  auto regions = checkpointed.find(forward.getStageIndex());
  return ordered_json{
      {"id", session.getSid().str()},
      {"stage", forward.getStageIndex()},
      {"microbatch", forward.getMicrobatchIndex()},
      {"rank",
       static_cast<int64_t>(session->getParentOfType<ProgramOp>().getRank())},
      {"regions", regions == checkpointed.end() ? std::vector<std::string>()
                                                : regions->second}};
}

void mlir::hpr::writePlanJson(ModuleOp module, const PlanSummary &summary,
                              const PlannerOptions &planner,
                              llvm::raw_ostream &os) {
  ScheduleOp schedule = getSchedule(module);
  CheckpointedRegions checkpointedRegions;
  json model = modelJson(getModel(module), checkpointedRegions);

  RankSummary total = summary.total();
  json peakBytes = json::array(), peakMemory = json::array(),
       maxLive = json::array(), hidden = json::array(), exposed = json::array();
  for (const RankSummary &rank : summary.ranks) {
    peakBytes.push_back(rank.peakBytes);
    peakMemory.push_back(rank.peakMemoryBytes);
    maxLive.push_back(rank.maxLiveSessions);
    hidden.push_back(rank.hiddenRecomputeUs);
    exposed.push_back(rank.exposedRecomputeUs);
  }
  // The small members, in the order DESIGN §4.3 lists them.
  std::pair<const char *, json> head[] = {
      {"format", "hp-recompute-plan"},
      {"version", 2},
      {"planner",
       {{"prefetch", planner.prefetch},
        {"checkpoint", planner.checkpoint},
        {"memory_budget",
         planner.memoryBudget ? json(*planner.memoryBudget) : json(nullptr)},
        {"tool", planner.tool}}},
      {"schedule", scheduleJson(schedule)},
      {"model", model},
      {"summary",
       {{"sessions", total.sessions},
        {"recomputes", total.recomputes},
        {"clears", total.clears},
        {"per_backward_recomputes", total.perBackwardRecomputes},
        {"step_time_us", summary.simulation.makespan},
        {"bubble_fraction", summary.simulation.bubbleFraction},
        {"busy_us", summary.simulation.busy},
        {"peak_bytes", peakBytes},
        {"peak_memory_bytes", peakMemory},
        {"max_live_sessions", maxLive},
        {"recompute_hidden_us", hidden},
        {"recompute_exposed_us", exposed}}}};
  os << "{\n";
  for (auto &[key, value] : head)
    os << " \"" << key << "\": " << ::hpr::dumpJson(value) << ",\n";

  auto programs = schedule.getBody().getOps<ProgramOp>();
  os << " \"sessions\": ";
  std::vector<Operation *> sessionOps;
  for (ProgramOp program : programs)
    for (SessionOp session : program.getBody().getOps<SessionOp>())
      sessionOps.push_back(session);
  writeArrayLines(
      os, sessionOps,
      [&](Operation *op) -> std::optional<ordered_json> {
        return sessionJson(cast<SessionOp>(op), checkpointedRegions);
      },
      "  ");
  // Ranks are independent: serialize them on all threads, write in order.
  auto programList = llvm::to_vector(programs);
  std::vector<std::string> rankTexts(programList.size());
  mlir::parallelFor(
      module.getContext(), 0, programList.size(), [&](size_t index) {
        llvm::raw_string_ostream rankOs(rankTexts[index]);
        rankOs << "  {\"rank\": " << programList[index].getRank()
               << ", \"actions\": ";
        llvm::DenseSet<Operation *> last = lastConsumers(programList[index]);
        writeArrayLines(
            rankOs, programList[index].getBody().getOps(),
            [&](Operation &op) -> std::optional<ordered_json> {
              if (!isa<ActionOpInterface>(op))
                return std::nullopt;
              return actionJson(&op, last);
            },
            "   ");
        rankOs << "}";
      });
  os << ",\n \"ranks\": [";
  for (auto [index, text] : llvm::enumerate(rankTexts))
    os << (index ? ",\n" : "\n") << text;
  os << "\n ]\n}\n";
}

//===----------------------------------------------------------------------===//
// Trace
//===----------------------------------------------------------------------===//

void mlir::hpr::writeTraceJson(const PlanSummary &summary,
                               llvm::raw_ostream &os) {
  const sched::Schedule &schedule = summary.timeline.schedule;
  // Chrome's trace event format: one complete ("X") event per action, one
  // thread per rank; chrome://tracing and Perfetto open it.
  os << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";
  bool first = true;
  for (auto [rank, program] : llvm::enumerate(schedule.ranks)) {
    os << (first ? "\n" : ",\n")
       << ::hpr::dumpJson(ordered_json{
              {"name", "thread_name"},
              {"ph", "M"},
              {"pid", 0},
              {"tid", rank},
              {"args", {{"name", "rank " + std::to_string(rank)}}}});
    first = false;
    for (auto [index, action] : llvm::enumerate(program)) {
      const sched::ActionTiming &timing =
          summary.simulation.timelines[rank][index];
      if (action.kind == sched::ActionKind::Idle || timing.end <= timing.start)
        continue;
      os << ",\n"
         << ::hpr::dumpJson(ordered_json{{"name", sched::formatAction(action)},
                                         {"ph", "X"},
                                         {"pid", 0},
                                         {"tid", rank},
                                         {"ts", timing.start},
                                         {"dur", timing.end - timing.start}});
    }
  }
  os << "\n]}\n";
}
