//===- PlanJson.cpp - The planned module as the plan JSON ----------------===//

#include "hpr/Plan/PlanJson.h"
#include "PlanJsonParts.h"

#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Model/Model.h"
#include "hpr/Schedule/ScheduleUtils.h"
#include "hpr/Support/Json.h"

#include "mlir/IR/Threading.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/JSON.h"

#include <map>
#include <set>
#include <tuple>
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

llvm::DenseSet<Operation *>
mlir::hpr::plan_json::lastBackwards(ProgramOp program) {
  llvm::DenseMap<int64_t, Operation *> last;
  for (Operation &op : program.getBody().getOps())
    if (isa<BackwardWeightOp, BackwardOp>(op))
      last[cast<ActionOpInterface>(op).getStageIndex()] = &op;
  llvm::DenseSet<Operation *> ops;
  for (auto &entry : last)
    ops.insert(entry.second);
  return ops;
}

/// The message tag of a transfer: the one it was read with, else (sending
/// stage, microbatch, direction), the same number at both ends.
static int64_t messageTag(Operation *op, int64_t stage, int64_t microbatch) {
  if (auto tag = op->getAttrOfType<IntegerAttr>("tag"))
    return tag.getInt();
  bool forward = isa<SendFOp, RecvFOp>(op);
  int64_t sender = stage;
  if (isa<RecvFOp>(op))
    sender = stage - 1;
  if (isa<RecvBOp>(op))
    sender = stage + 1;
  int64_t microbatches = op->getParentOfType<ScheduleOp>().getNumMicrobatches();
  return (sender * microbatches + microbatch) * 2 + (forward ? 0 : 1);
}

namespace {
/// One message, seen from either end: forward or backward, the receiving
/// stage, the microbatch.
using MessageKey = std::tuple<bool, int64_t, int64_t>;

MessageKey messageOf(Operation *op) {
  auto action = cast<ActionOpInterface>(op);
  bool forward = isa<SendFOp, RecvFOp>(op);
  int64_t stage = action.getStageIndex();
  if (isa<SendFOp>(op))
    ++stage;
  if (isa<SendBOp>(op))
    --stage;
  return {forward, stage, action.getMicrobatchIndex()};
}

int64_t peerOf(Operation *op) {
  return llvm::TypeSwitch<Operation *, int64_t>(op)
      .Case<SendFOp, RecvFOp, SendBOp, RecvBOp>(
          [](auto comm) { return static_cast<int64_t>(comm.getPeer()); })
      .Default([](Operation *) { return -1; });
}
} // namespace

ReceivePosts mlir::hpr::plan_json::receivePosts(ScheduleOp schedule) {
  ReceivePosts result;
  auto programs = llvm::to_vector(schedule.getBody().getOps<ProgramOp>());
  // (sender, receiver) -> the sender's messages to the receiver, in order.
  std::map<std::pair<int64_t, int64_t>, std::vector<MessageKey>> sent;
  bool given = false;
  for (ProgramOp program : programs)
    for (Operation &op : program.getBody().getOps()) {
      if (isa<SendFOp, SendBOp>(op))
        sent[{program.getRank(), peerOf(&op)}].push_back(messageOf(&op));
      given |= isa<RecvFOp, RecvBOp>(op) && op.hasAttr("posts");
    }
  for (ProgramOp program : programs) {
    // The program's receives by message, and each action's index.
    std::map<MessageKey, int64_t> receiveOf;
    llvm::SmallVector<Operation *> receives;
    llvm::DenseMap<Operation *, int64_t> indexOf;
    int64_t index = 0;
    for (Operation &op : program.getBody().getOps()) {
      if (!isa<ActionOpInterface>(op))
        continue;
      if (isa<RecvFOp, RecvBOp>(op)) {
        receiveOf.insert({messageOf(&op), index});
        receives.push_back(&op);
        indexOf[&op] = index;
      }
      ++index;
    }
    if (given) {
      for (Operation *op : receives)
        if (auto posts = op->getAttrOfType<DenseI64ArrayAttr>("posts"))
          result[op].assign(posts.asArrayRef().begin(),
                            posts.asArrayRef().end());
        else
          result[op];
      continue;
    }
    std::map<int64_t, size_t> nextFromPeer;
    llvm::DenseSet<int64_t> posted;
    for (Operation *op : receives) {
      int64_t self = indexOf[op], peer = peerOf(op);
      llvm::SmallVector<int64_t> &list = result[op];
      auto sends = sent.find({peer, program.getRank()});
      size_t &next = nextFromPeer[peer];
      while (sends != sent.end() && !posted.contains(self) &&
             next < sends->second.size()) {
        auto recv = receiveOf.find(sends->second[next++]);
        if (recv != receiveOf.end() && posted.insert(recv->second).second)
          list.push_back(recv->second);
      }
      if (posted.insert(self).second)
        list.push_back(self);
    }
  }
  return result;
}

ReceiveReaders mlir::hpr::plan_json::receiveReaders(ScheduleOp schedule) {
  ReceiveReaders result;
  for (ProgramOp program : schedule.getBody().getOps<ProgramOp>()) {
    // The message a receive brings, by its receiving end, and its index.
    std::map<MessageKey, llvm::SmallVector<int64_t>> receives;
    int64_t index = 0;
    for (Operation &op : program.getBody().getOps()) {
      if (!isa<ActionOpInterface>(op))
        continue;
      if (isa<RecvFOp, RecvBOp>(op))
        receives[messageOf(&op)].push_back(index);
      ++index;
    }
    // The forward reads its input; the first I or B its output gradient.
    std::set<MessageKey> read;
    for (Operation &op : program.getBody().getOps()) {
      if (!isa<ForwardOp, BackwardInputOp, BackwardOp>(op))
        continue;
      auto action = cast<ActionOpInterface>(op);
      MessageKey message{isa<ForwardOp>(op), action.getStageIndex(),
                         action.getMicrobatchIndex()};
      auto it = receives.find(message);
      if (it != receives.end() && read.insert(message).second)
        result[&op] = it->second;
    }
  }
  return result;
}

int64_t mlir::hpr::plan_json::resultStage(Operation *op) {
  // Where the transfer of its result would go.
  sched::Action transfer;
  transfer.kind =
      isa<ForwardOp>(op) ? sched::ActionKind::SendF : sched::ActionKind::SendB;
  transfer.stage =
      static_cast<int>(cast<ActionOpInterface>(op).getStageIndex());
  return sched::neighbourStage(transfer);
}

Handoffs mlir::hpr::plan_json::handoffs(ScheduleOp schedule) {
  Handoffs result;
  for (ProgramOp program : schedule.getBody().getOps<ProgramOp>())
    for (Operation &op : program.getBody().getOps()) {
      if (!isa<ForwardOp, BackwardInputOp, BackwardOp>(op))
        continue;
      int64_t neighbour = resultStage(&op);
      if (neighbour >= 0 &&
          neighbour < static_cast<int64_t>(schedule.getNumStages()) &&
          schedule.getRankOf(neighbour) ==
              static_cast<int64_t>(program.getRank()))
        result[&op] = neighbour;
    }
  return result;
}

LoweredMembers mlir::hpr::plan_json::lowerActionMembers(ScheduleOp schedule) {
  LoweredMembers lowered;
  lowered.posts = receivePosts(schedule);
  lowered.waits = receiveReaders(schedule);
  for (ProgramOp program : schedule.getBody().getOps<ProgramOp>())
    for (Operation *op : lastBackwards(program))
      lowered.lastBackwards.insert(op);
  lowered.handsTo = handoffs(schedule);
  return lowered;
}

void mlir::hpr::plan_json::forEachActionMember(
    Operation *op, const llvm::DenseSet<Operation *> &lastConsumers,
    llvm::function_ref<void(llvm::StringRef, const ActionMemberValue &)> member,
    const LoweredMembers *lowered) {
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
      })
      .Case<ClearOp>([&](ClearOp clear) {
        member("session", clear.getSessionOp().getSid());
      })
      .Case<SendFOp, RecvFOp, SendBOp, RecvBOp>([&](auto comm) {
        member("peer", static_cast<int64_t>(comm.getPeer()));
        member("tag", messageTag(op, action.getStageIndex(),
                                 action.getMicrobatchIndex()));
        if (comm.getBatched())
          member("batched", true);
      });
  if (lowered && isa<RecvFOp, RecvBOp>(op))
    if (auto it = lowered->posts.find(op); it != lowered->posts.end())
      member("posts", llvm::ArrayRef<int64_t>(it->second));
  if (lowered)
    if (auto it = lowered->waits.find(op); it != lowered->waits.end())
      member("waits", llvm::ArrayRef<int64_t>(it->second));
  if (auto consumer = dyn_cast<ConsumerOpInterface>(op))
    if (Value session = consumer.getSessionValue()) {
      member("session", session.getDefiningOp<SessionOp>().getSid());
      member("retain_on_unpack", consumer.getRetainOnUnpackFlag());
    }
  if (lastConsumers.contains(op))
    member("frees_graph", true);
  if (lowered && lowered->lastBackwards.contains(op))
    member("last_backward", true);
  if (lowered)
    if (auto it = lowered->handsTo.find(op); it != lowered->handsTo.end())
      member("hands_to", it->second);
  if (isOverlapped(op))
    member("overlap", true);
  if (auto forward = dyn_cast<ForwardOp>(op))
    if (forward.getNoCheckpoint())
      member("checkpoint", false);
}

ordered_json mlir::hpr::plan_json::actionJson(
    Operation *op, const llvm::DenseSet<Operation *> &lastConsumers) {
  ordered_json entry = ordered_json::object();
  forEachActionMember(
      op, lastConsumers,
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
      });
  return entry;
}

/// Writes `op`'s action object compactly. LLVM's streaming JSON writer, as
/// nlohmann/json has none: no object per action is built, which made up most
/// of the export of a million actions.
static void writeActionJson(llvm::raw_ostream &os, Operation *op,
                            const llvm::DenseSet<Operation *> &lastConsumers,
                            const LoweredMembers &lowered) {
  llvm::json::OStream out(os);
  out.object([&] {
    forEachActionMember(
        op, lastConsumers,
        [&](llvm::StringRef key, const ActionMemberValue &value) {
          std::visit(
              [&](auto v) {
                if constexpr (std::is_same_v<decltype(v),
                                             llvm::ArrayRef<int64_t>>)
                  out.attributeArray(key, [&] {
                    for (int64_t index : v)
                      out.value(index);
                  });
                else
                  out.attribute(key, v);
              },
              value);
        },
        &lowered);
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
  // Ranks are independent: serialize them on all threads, write in order.
  auto programList = llvm::to_vector(programs);
  LoweredMembers lowered = lowerActionMembers(schedule);
  std::vector<std::string> rankTexts(programList.size());
  mlir::parallelFor(
      module.getContext(), 0, programList.size(), [&](size_t index) {
        llvm::raw_string_ostream rankOs(rankTexts[index]);
        rankOs.SetBuffered(); // the JSON writer writes a few bytes at a time
        rankOs << "  {\"rank\": " << programList[index].getRank()
               << ", \"actions\": ";
        llvm::DenseSet<Operation *> last = lastConsumers(programList[index]);
        rankOs << "[";
        bool first = true;
        for (Operation &op : programList[index].getBody().getOps()) {
          if (!isa<ActionOpInterface>(op))
            continue; // a session
          rankOs << (first ? "\n   " : ",\n   ");
          writeActionJson(rankOs, &op, last, lowered);
          first = false;
        }
        rankOs << "\n  ]}";
        rankOs.flush();
      });
  os << ",\n \"ranks\": [";
  for (auto [index, text] : llvm::enumerate(rankTexts))
    os << (index ? ",\n" : "\n") << text;
  os << "\n ]\n}\n";
}
