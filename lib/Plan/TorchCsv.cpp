//===- TorchCsv.cpp - Planned hpr IR -> torch's schedule CSV -------------===//

#include "hpr/Plan/TorchCsv.h"
#include "PlanJsonParts.h"

#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Support/Json.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSwitch.h"

#include <map>
#include <string>
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
/// One element of a rank's row before it is written: a cell, or a recompute
/// or clear for the sidecar (`cell` empty).
struct RowItem {
  std::string cell;
  ordered_json insert;
};

/// One rank's items and the sidecar's lists.
struct RankRow {
  std::vector<RowItem> items;
  ordered_json consumers = ordered_json::array();
  ordered_json plain = ordered_json::array();
};
} // namespace

/// Rank `program`'s row. torch's point-to-point ops carry no tag, so two
/// ranks match messages in posting order: each RECV cell is written where the
/// plan posts it (`posts`, receivePosts), since torch's RECV only posts and
/// the action that reads the data waits. The planner lowered REDUCE_GRAD
/// (after each stage's last W or B, where torch's `_add_reduce_grad` puts
/// it), which torch's compute+comms format expects in the CSV.
static RankRow collectRow(ProgramOp program, const ReceivePosts &posts) {
  RankRow row;
  llvm::DenseSet<Operation *> last = lastConsumers(program);
  // The cell of each receive, by its index among the program's actions.
  std::map<int64_t, std::string> receiveCell;
  int64_t index = 0;
  for (Operation &op : program.getBody().getOps())
    if (auto action = dyn_cast<ActionOpInterface>(op)) {
      if (isa<RecvFOp, RecvBOp>(op))
        receiveCell[index] = torchCell(action);
      ++index;
    }
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
      row.items.push_back(
          {"(" + pendingForward + ";" + torchCell(action) + ")OVERLAP_F_B",
           ordered_json()});
      continue;
    }
    if (isa<RecvFOp, RecvBOp>(op)) {
      if (auto it = posts.find(&op); it != posts.end())
        for (int64_t posted : it->second)
          if (auto cell = receiveCell.find(posted); cell != receiveCell.end())
            row.items.push_back({cell->second, ordered_json()});
      continue;
    }
    row.items.push_back({torchCell(action), ordered_json()});
  }
  return row;
}

/// Writes rank `rank`'s row and returns its sidecar entry.
static ordered_json writeRow(int64_t rank, const RankRow &row,
                             llvm::raw_ostream &csv) {
  ordered_json inserts = ordered_json::array();
  int64_t cells = 0;
  for (const RowItem &item : row.items) {
    if (item.cell.empty()) {
      ordered_json entry = item.insert;
      entry["before"] = cells;
      inserts.push_back(std::move(entry));
      continue;
    }
    csv << (cells ? "," : "") << item.cell;
    ++cells;
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
  ReceivePosts posts = receivePosts(schedule);
  int64_t rank = 0;
  for (ProgramOp program : schedule.getBody().getOps<ProgramOp>()) {
    for (SessionOp session : program.getBody().getOps<SessionOp>())
      sessions.push_back(sessionJson(session, checkpointed));
    ranks.push_back(writeRow(rank++, collectRow(program, posts), csv));
  }
  ordered_json document = {{"format", "hp-recompute-torch-csv"},
                           {"version", 1},
                           {"csv", csvName.str()},
                           {"schedule", scheduleJson(schedule)},
                           {"model", std::move(model)},
                           {"sessions", std::move(sessions)},
                           {"ranks", std::move(ranks)}};
  sidecar << dumpJson(document) << "\n";
}
