//===- TorchCsv.cpp - Planned hpr IR -> torch's schedule CSV -------------===//

#include "hpr/Plan/TorchCsv.h"
#include "PlanJsonParts.h"

#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Support/Json.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSwitch.h"

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

using namespace mlir;
using namespace mlir::hpr;
using namespace mlir::hpr::plan_json;
using nlohmann::json;
using ordered_json = nlohmann::ordered_json;

/// torch's `_ComputationType` value of an action, or "" for those torch has
/// no action for (recompute, clear: the sidecar's) and idle (no cell).
static StringRef torchType(ActionOpInterface action) {
  return llvm::StringSwitch<StringRef>(action.getPlanName())
      .Case("forward", "F")
      .Case("backward_input", "I")
      .Case("backward_weight", "W")
      .Case("backward", "B")
      .Case("send_f", "SEND_F")
      .Case("recv_f", "RECV_F")
      .Case("send_b", "SEND_B")
      .Case("recv_b", "RECV_B")
      .Case("unshard", "UNSHARD")
      .Case("reshard", "RESHARD")
      .Case("reduce_grad", "REDUCE_GRAD")
      .Default("");
}

/// `2F0`, `1SEND_B3`, `0REDUCE_GRAD`: torch's `_Action.__repr__`.
static std::string torchCell(ActionOpInterface action) {
  std::string cell = std::to_string(action.getStageIndex());
  cell += torchType(action).str();
  if (action.getMicrobatchIndex() >= 0)
    cell += std::to_string(action.getMicrobatchIndex());
  return cell;
}

namespace {
/// What one message is, seen from either end: its direction ('f' or 'b'), the
/// receiving stage and the microbatch.
using MessageKey = std::tuple<char, int64_t, int64_t>;

/// One element of a rank's row before it is written: a cell, or a recompute
/// or clear for the sidecar (`cell` empty).
struct RowItem {
  std::string cell;
  ordered_json insert;
  /// For a receive: from whom, and which message.
  int64_t recvPeer = -1;
  MessageKey message;
};

/// One rank's items and, per peer, the messages it sends there in order.
struct RankRow {
  std::vector<RowItem> items;
  std::map<int64_t, std::vector<MessageKey>> sendsTo;
  ordered_json consumers = ordered_json::array();
  ordered_json plain = ordered_json::array();
};
} // namespace

static MessageKey messageOf(ActionOpInterface action, bool isSend) {
  bool forward = isa<SendFOp, RecvFOp>(action.getOperation());
  int64_t stage = action.getStageIndex();
  if (isSend)
    stage += forward ? 1 : -1;
  return {forward ? 'f' : 'b', stage, action.getMicrobatchIndex()};
}

/// The op after which a stage's gradients are complete: its last W or B, for
/// each stage of `program` without a reduce_grad of its own.
static llvm::DenseSet<Operation *> reduceGradPoints(ProgramOp program) {
  std::map<int64_t, Operation *> last;
  std::set<int64_t> reduced;
  for (Operation &op : program.getBody().getOps()) {
    if (isa<BackwardWeightOp, BackwardOp>(op))
      last[cast<ActionOpInterface>(op).getStageIndex()] = &op;
    if (auto action = dyn_cast<ActionOpInterface>(op))
      if (action.getPlanName() == "reduce_grad")
        reduced.insert(action.getStageIndex());
  }
  llvm::DenseSet<Operation *> points;
  for (auto [stage, op] : last)
    if (!reduced.count(stage))
      points.insert(op);
  return points;
}

static RankRow collectRow(ProgramOp program) {
  RankRow row;
  llvm::DenseSet<Operation *> last = lastConsumers(program);
  // torch's lowering (`_add_reduce_grad`) puts REDUCE_GRAD (gradient scaling,
  // FSDP's post-backward) after a stage's last W or B; its compute+comms
  // format expects it in the CSV.
  llvm::DenseSet<Operation *> reduceAfter = reduceGradPoints(program);
  auto addReduce = [&](Operation &op) {
    if (!reduceAfter.count(&op))
      return;
    RowItem item;
    item.cell = std::to_string(cast<ActionOpInterface>(op).getStageIndex()) +
                "REDUCE_GRAD";
    row.items.push_back(std::move(item));
  };
  std::string pendingForward; // the F of an overlapped pair
  for (Operation &op : program.getBody().getOps()) {
    auto action = dyn_cast<ActionOpInterface>(op);
    if (!action)
      continue;
    if (isa<RecomputeOp, ClearOp>(op)) {
      RowItem item;
      item.insert = actionJson(&op, last);
      row.items.push_back(std::move(item));
      continue;
    }
    if (auto consumer = dyn_cast<ConsumerOpInterface>(op))
      if (consumer.getSessionValue()) {
        ordered_json entry = actionJson(&op, last);
        entry.erase("overlap");
        row.consumers.push_back(std::move(entry));
      }
    if (auto forward = dyn_cast<ForwardOp>(op))
      if (forward.getNoCheckpoint())
        row.plain.push_back(
            ordered_json{{"stage", forward.getStageIndex()},
                         {"microbatch", forward.getMicrobatchIndex()}});
    if (torchType(action).empty())
      continue; // idle: torch's compute+comms rows have no empty cells
    if (isOverlapped(&op)) {
      // The verifier guarantees a marked forward is followed by its backward.
      if (isa<ForwardOp>(op)) {
        pendingForward = torchCell(action);
        continue;
      }
      RowItem item;
      item.cell =
          "(" + pendingForward + ";" + torchCell(action) + ")OVERLAP_F_B";
      row.items.push_back(std::move(item));
      addReduce(op);
      continue;
    }
    RowItem item;
    item.cell = torchCell(action);
    if (auto send = dyn_cast<SendFOp>(op))
      row.sendsTo[send.getPeer()].push_back(messageOf(action, true));
    if (auto send = dyn_cast<SendBOp>(op))
      row.sendsTo[send.getPeer()].push_back(messageOf(action, true));
    if (auto recv = dyn_cast<RecvFOp>(op)) {
      item.recvPeer = recv.getPeer();
      item.message = messageOf(action, false);
    }
    if (auto recv = dyn_cast<RecvBOp>(op)) {
      item.recvPeer = recv.getPeer();
      item.message = messageOf(action, false);
    }
    row.items.push_back(std::move(item));
    addReduce(op);
  }
  return row;
}

/// Writes rank `rank`'s row. torch's point-to-point ops carry no tag, so two
/// ranks match messages in posting order; a receive is therefore posted, in
/// the sender's order, together with every receive from that peer the sender
/// sends before it (moved earlier, never later: torch's RECV only posts, the
/// action that reads the data waits).
static ordered_json writeRow(int64_t rank, const std::vector<RankRow> &rows,
                             llvm::raw_ostream &csv) {
  const RankRow &row = rows[rank];
  std::map<int64_t, size_t> nextFromPeer;
  std::set<MessageKey> posted;
  std::map<MessageKey, const RowItem *> recvOf;
  for (const RowItem &item : row.items)
    if (item.recvPeer >= 0)
      recvOf[item.message] = &item;
  ordered_json inserts = ordered_json::array();
  int64_t cells = 0;
  auto emit = [&](const std::string &cell) {
    csv << (cells ? "," : "") << cell;
    ++cells;
  };
  for (const RowItem &item : row.items) {
    if (item.cell.empty()) {
      ordered_json entry = item.insert;
      entry["before"] = cells;
      inserts.push_back(std::move(entry));
      continue;
    }
    if (item.recvPeer < 0) {
      emit(item.cell);
      continue;
    }
    // The verified plan pairs every receive with a send; a receive the peer
    // does not send is still written, in its own place.
    auto sends = rows[item.recvPeer].sendsTo.find(rank);
    size_t &next = nextFromPeer[item.recvPeer];
    while (sends != rows[item.recvPeer].sendsTo.end() &&
           !posted.count(item.message) && next < sends->second.size()) {
      MessageKey message = sends->second[next++];
      auto recv = recvOf.find(message);
      if (recv == recvOf.end())
        continue;
      posted.insert(message);
      emit(recv->second->cell);
    }
    if (posted.insert(item.message).second)
      emit(item.cell);
  }
  csv << "\n";
  return ordered_json{{"rank", rank},
                      {"cells", cells},
                      {"inserts", std::move(inserts)},
                      {"consumers", row.consumers},
                      {"plain_forwards", row.plain}};
}

void mlir::hpr::writeTorchCsv(ModuleOp module, StringRef csvName,
                              llvm::raw_ostream &csv,
                              llvm::raw_ostream &sidecar) {
  ScheduleOp schedule = getSchedule(module);
  CheckpointedRegions checkpointed;
  json model = modelJson(getModel(module), checkpointed);
  ordered_json sessions = ordered_json::array(), ranks = ordered_json::array();
  std::vector<RankRow> rows;
  for (ProgramOp program : schedule.getBody().getOps<ProgramOp>()) {
    for (SessionOp session : program.getBody().getOps<SessionOp>())
      sessions.push_back(sessionJson(session, checkpointed));
    rows.push_back(collectRow(program));
  }
  for (int64_t rank = 0, e = rows.size(); rank < e; ++rank)
    ranks.push_back(writeRow(rank, rows, csv));
  ordered_json document = {{"format", "hp-recompute-torch-csv"},
                           {"version", 1},
                           {"csv", csvName.str()},
                           {"schedule", scheduleJson(schedule)},
                           {"model", std::move(model)},
                           {"sessions", std::move(sessions)},
                           {"ranks", std::move(ranks)}};
  sidecar << dumpJson(document) << "\n";
}
