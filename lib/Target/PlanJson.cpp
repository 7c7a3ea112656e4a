//===- PlanJson.cpp - The planned module as the plan JSON ----------------===//

#include "hpr/Target/PlanJson.h"
#include "PlanJsonParts.h"

#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Model/Model.h"
#include "hpr/Support/Json.h"

#include "mlir/IR/Threading.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/JSON.h"

#include <map>
#include <type_traits>
#include <variant>
#include <vector>

using namespace mlir;
using namespace mlir::hpr;
using nlohmann::json;
/// Per-action and per-session objects keep their keys in insertion order
/// (`op` first), which also makes them cheaper to build than sorted maps.
using ordered_json = nlohmann::ordered_json;

using namespace mlir::hpr::plan_json;

static json regionJson(RegionOp region) {
  json entry = {{"name", region.getName().str()},
                // false, true or "selective", as in the model JSON
                {"checkpoint", region.getSelective()
                                   ? json("selective")
                                   : json(region.getCheckpoint())},
                {"checkpointable", !region.getNonCheckpointable()},
                {"fwd_flops", region.getFwdFlops().convertToDouble()},
                {"fwd_time_us", region.getFwdTimeUs().convertToDouble()},
                {"saved_bytes", static_cast<int64_t>(region.getSavedBytes())},
                {"input_bytes", static_cast<int64_t>(region.getInputBytes())},
                {"param_bytes", static_cast<int64_t>(region.getParamBytes())}};
  for (const model::MeasuredTime &time : model::kMeasuredTimes)
    if (auto value = region->getAttrOfType<FloatAttr>(time.key))
      entry[time.key] = value.getValueAsDouble();
  for (const model::MeasuredBytes &bytes : model::kMeasuredBytes)
    if (auto value = region->getAttrOfType<IntegerAttr>(bytes.key))
      entry[bytes.key] = value.getInt();
  return entry;
}

void mlir::hpr::plan_json::forEachActionMember(
    Operation *op,
    llvm::function_ref<void(llvm::StringRef, const ActionMemberValue &)> member,
    bool schedule) {
  auto action = cast<ActionOpInterface>(op);
  member("op", action.getPlanName());
  if (action.getStageIndex() >= 0)
    member("stage", action.getStageIndex());
  if (action.getMicrobatchIndex() >= 0)
    member("microbatch", action.getMicrobatchIndex());
  llvm::TypeSwitch<Operation *>(op)
      .Case<RecomputeOp>([&](RecomputeOp recompute) {
        member("session", recompute.getSessionOp().getSid());
        if (recompute.getInBackward())
          member("in_backward", true);
        if (std::optional<ArrayRef<int64_t>> regions = recompute.getRegions())
          member("regions", *regions);
        if (recompute.getForWeight())
          member("for_weight", true);
      })
      .Case<ClearOp>([&](ClearOp clear) {
        member("session", clear.getSessionOp().getSid());
      })
      .Case<SendFOp, RecvFOp, SendBOp, RecvBOp>([&](auto comm) {
        member("peer", static_cast<int64_t>(comm.getPeer()));
        if (std::optional<uint64_t> tag = comm.getTag())
          member("tag", static_cast<int64_t>(*tag));
        if (comm.getBatched())
          member("batched", true);
      });
  if (schedule) {
    llvm::TypeSwitch<Operation *>(op).Case<RecvFOp, RecvBOp>([&](auto recv) {
      if (std::optional<ArrayRef<int64_t>> posts = recv.getPosts())
        member("posts", *posts);
    });
    if (std::optional<ArrayRef<int64_t>> waits = getWaits(op))
      member("waits", *waits);
  }
  if (auto consumer = dyn_cast<ConsumerOpInterface>(op))
    if (Value session = consumer.getSessionValue()) {
      member("session", session.getDefiningOp<SessionOp>().getSid());
      member("retain_on_unpack", consumer.getRetainOnUnpackFlag());
    }
  if (freesGraph(op))
    member("frees_graph", true);
  if (auto input = dyn_cast<BackwardInputOp>(op);
      input && input.getDropsReplay())
    member("drops_replay", true);
  if (auto weight = dyn_cast<BackwardWeightOp>(op);
      weight && weight.getWeightReplay())
    member("weight_replay", true);
  if (schedule && isLastBackward(op))
    member("last_backward", true);
  if (schedule)
    if (std::optional<int64_t> stage = getHandsTo(op))
      member("hands_to", *stage);
  if (isOverlapped(op))
    member("overlap", true);
  if (auto forward = dyn_cast<ForwardOp>(op))
    if (forward.getNoCheckpoint())
      member("checkpoint", false);
}

ordered_json mlir::hpr::plan_json::actionJson(Operation *op) {
  ordered_json entry = ordered_json::object();
  forEachActionMember(
      op,
      [&](llvm::StringRef key, const ActionMemberValue &value) {
        std::visit(
            [&](auto v) {
              using T = decltype(v);
              if constexpr (std::is_same_v<T, llvm::StringRef>)
                entry[key.str()] = v.str();
              else if constexpr (std::is_same_v<T, llvm::ArrayRef<int64_t>>)
                entry[key.str()] = std::vector<int64_t>(v.begin(), v.end());
              else
                entry[key.str()] = v;
            },
            value);
      },
      /*schedule=*/false);
  return entry;
}

/// Writes `op`'s action object compactly. LLVM's streaming JSON writer, as
/// nlohmann/json has none: no object per action is built, which made up most
/// of the export of a million actions.
static void writeActionJson(llvm::raw_ostream &os, Operation *op) {
  llvm::json::OStream out(os);
  out.object([&] {
    forEachActionMember(op, [&](llvm::StringRef key,
                                const ActionMemberValue &value) {
      std::visit(
          [&](auto v) {
            if constexpr (std::is_same_v<decltype(v), llvm::ArrayRef<int64_t>>)
              out.attributeArray(key, [&] {
                for (int64_t index : v)
                  out.value(index);
              });
            else
              out.attribute(key, v);
          },
          value);
    });
  });
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
  json result = {{"name", model.getName().str()},
                 {"stages", std::move(stages)}};
  // As the model JSON has it, and only with data parallelism.
  if (model.getDpShard() || model.getDpReplicate())
    result["data_parallel"] = {
        {"shard", static_cast<int64_t>(model.getDpShard().value_or(1))},
        {"replicate",
         static_cast<int64_t>(model.getDpReplicate().value_or(1))}};
  return result;
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
  json plannerJson = {{"prefetch", planner.prefetch},
                      {"checkpoint", planner.checkpoint},
                      {"memory_budget", planner.memoryBudget
                                            ? json(*planner.memoryBudget)
                                            : json(nullptr)},
                      {"tool", planner.tool}};
  if (!planner.scheduleCandidates.empty()) {
    json candidates = json::array();
    for (const ScheduleCandidate &candidate : planner.scheduleCandidates) {
      json entry = {{"schedule", candidate.schedule}};
      if (candidate.stepUs) {
        entry["step_time_us"] = *candidate.stepUs;
        entry["peak_bytes"] = candidate.peakBytes;
      } else {
        entry["refused"] = candidate.refusal;
      }
      candidates.push_back(std::move(entry));
    }
    plannerJson["schedule_candidates"] = std::move(candidates);
  }
  // The small members, in the order DESIGN §4.3 lists them.
  std::pair<const char *, json> head[] = {
      {"format", "hp-recompute-plan"},
      {"version", 2},
      {"planner", std::move(plannerJson)},
      {"schedule", scheduleJson(schedule)},
      {"model", model},
      {"summary",
       {{"sessions", total.sessions},
        {"recomputes", total.recomputes},
        {"weight_replays", total.weightReplays},
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
    os << " \"" << key << "\": " << dumpJson(value) << ",\n";

  auto programs = schedule.getBody().getOps<ProgramOp>();
  // One compact element per line, so that a plan of a million actions
  // streams out without a document-sized DOM.
  os << " \"sessions\": [";
  bool firstSession = true;
  for (ProgramOp program : programs)
    for (SessionOp session : program.getBody().getOps<SessionOp>()) {
      os << (firstSession ? "\n  " : ",\n  ")
         << dumpJson(sessionJson(session, checkpointedRegions));
      firstSession = false;
    }
  os << "\n ]";
  // Ranks are independent: serialized on all threads, as many at a time as
  // there are threads, each batch written in order and freed before the next
  // (a rank of a plan of a million actions is over 10 MB of text).
  auto programList = llvm::to_vector(programs);
  MLIRContext *context = module.getContext();
  size_t batch = std::max<size_t>(1, context->getNumThreads());
  os << ",\n \"ranks\": [";
  for (size_t begin = 0; begin < programList.size(); begin += batch) {
    size_t end = std::min(programList.size(), begin + batch);
    std::vector<std::string> rankTexts(end - begin);
    mlir::parallelFor(context, begin, end, [&](size_t index) {
      llvm::raw_string_ostream rankOs(rankTexts[index - begin]);
      rankOs.SetBuffered(); // the JSON writer writes a few bytes at a time
      rankOs << "  {\"rank\": " << programList[index].getRank()
             << ", \"actions\": ";
      rankOs << "[";
      bool first = true;
      for (Operation &op : programList[index].getBody().getOps()) {
        if (!isa<ActionOpInterface>(op))
          continue; // a session
        rankOs << (first ? "\n   " : ",\n   ");
        writeActionJson(rankOs, &op);
        first = false;
      }
      rankOs << "\n  ]}";
      rankOs.flush();
    });
    for (auto [offset, text] : llvm::enumerate(rankTexts))
      os << (begin + offset ? ",\n" : "\n") << text;
  }
  os << "\n ]\n}\n";
}
