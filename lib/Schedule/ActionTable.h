//===- ActionTable.h - Index of a schedule's actions (private) --*- C++ -*-===//
//
// Dense tables keyed by (slot, stage, microbatch) that find the action that
// does a given piece of work. Shared by the simulator and the validator.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_LIB_SCHEDULE_ACTIONTABLE_H
#define HPR_LIB_SCHEDULE_ACTIONTABLE_H

#include "hpr/Schedule/Schedule.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mlir::hpr::sched::detail {

/// What a primitive action produces. I and B share Dx: both produce the
/// gradient that flows to the previous stage.
enum Slot : int {
  SlotF,
  SlotDx,
  SlotW,
  SlotSendF,
  SlotSendB,
  SlotRecvF,
  SlotRecvB,
  SlotRecompute,
  SlotClear,
  NumSlots
};

/// The slot of a primitive kind, or -1 (Idle, UNSHARD, ...).
inline int slotOf(ActionKind kind) {
  switch (kind) {
  case ActionKind::Forward:
    return SlotF;
  case ActionKind::BackwardInput:
  case ActionKind::Backward:
    return SlotDx;
  case ActionKind::BackwardWeight:
    return SlotW;
  case ActionKind::SendF:
    return SlotSendF;
  case ActionKind::SendB:
    return SlotSendB;
  case ActionKind::RecvF:
    return SlotRecvF;
  case ActionKind::RecvB:
    return SlotRecvB;
  case ActionKind::Recompute:
    return SlotRecompute;
  case ActionKind::Clear:
    return SlotClear;
  default:
    return -1;
  }
}

/// Flat numbering of all actions: global id = offset[rank] + index.
struct ActionNumbering {
  std::vector<int64_t> offset; // size numRanks + 1

  explicit ActionNumbering(const Schedule &schedule) {
    offset.push_back(0);
    for (const auto &program : schedule.ranks)
      offset.push_back(offset.back() + static_cast<int64_t>(program.size()));
  }
  int64_t id(int rank, int index) const { return offset[rank] + index; }
  int rankOf(int64_t id) const {
    return static_cast<int>(std::upper_bound(offset.begin(), offset.end(), id) -
                            offset.begin() - 1);
  }
  int indexOf(int64_t id) const {
    return static_cast<int>(id - offset[rankOf(id)]);
  }
  int64_t size() const { return offset.back(); }
};

/// (slot, stage, microbatch) -> first action doing it, and how many do.
struct ActionTable {
  int numStages = 0;
  int numMicrobatches = 0;
  std::vector<int64_t> first;    // global id, -1 if none
  std::vector<int8_t> firstPart; // composite part index, -1 if not a part
  std::vector<uint8_t> count;    // saturates at 255

  void reset(int stages, int microbatches) {
    numStages = stages;
    numMicrobatches = microbatches;
    size_t n = static_cast<size_t>(NumSlots) * stages * microbatches;
    first.assign(n, -1);
    firstPart.assign(n, -1);
    count.assign(n, 0);
  }
  bool inRange(int stage, int mb) const {
    return stage >= 0 && stage < numStages && mb >= 0 && mb < numMicrobatches;
  }
  size_t key(int slot, int stage, int mb) const {
    return (static_cast<size_t>(slot) * numStages + stage) * numMicrobatches +
           mb;
  }
  /// Records one occurrence; returns the new count.
  int add(int slot, int stage, int mb, int64_t id, int part) {
    size_t k = key(slot, stage, mb);
    if (count[k] == 0) {
      first[k] = id;
      firstPart[k] = static_cast<int8_t>(part);
    }
    if (count[k] < 255)
      ++count[k];
    return count[k];
  }
};

} // namespace mlir::hpr::sched::detail

#endif // HPR_LIB_SCHEDULE_ACTIONTABLE_H
