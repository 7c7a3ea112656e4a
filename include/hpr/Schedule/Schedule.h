//===- Schedule.h - Pipeline schedule data model ----------------*- C++ -*-===//
//
// A pipeline schedule as torch.distributed.pipelining describes it: one
// ordered list of actions per rank. This is the in-memory form shared by the
// CSV/JSON readers and writers, the generators, the validator and the comm
// lowering; the hpr IR is built from it (see hpr/Target/BuildModule.h).
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SCHEDULE_SCHEDULE_H
#define HPR_SCHEDULE_SCHEDULE_H

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mlir::hpr::sched {

/// What one action does. Names follow the current torch.distributed.pipelining
/// dialect; the legacy dialect maps onto the same kinds when read.
enum class ActionKind {
  Idle,           ///< empty CSV cell: an idle slot
  Forward,        ///< F
  BackwardInput,  ///< I (legacy B): dx
  BackwardWeight, ///< W: dw
  Backward,       ///< B (legacy BW): full backward
  SendF,
  RecvF,
  SendB,
  RecvB,
  Unshard,    ///< no microbatch
  Reshard,    ///< no microbatch
  ReduceGrad, ///< no microbatch
  Recompute,  ///< written by the planner only
  Clear,      ///< written by the planner only
  OverlapFB,  ///< composite `(0F7;7B3)OVERLAP_F_B`: parts hold F then B/I/W
  BatchedComm ///< legacy combined comm `0SEND_F0_1RECV_B0`: parts hold comms
};

/// True for F, I, W, B: the actions that run the model.
bool isCompute(ActionKind kind);
/// True for SEND_F, RECV_F, SEND_B, RECV_B.
bool isComm(ActionKind kind);
/// True for UNSHARD, RESHARD, REDUCE_GRAD (they carry a stage but no
/// microbatch).
bool hasNoMicrobatch(ActionKind kind);

struct Action {
  ActionKind kind = ActionKind::Idle;
  int stage = -1;      ///< -1 for Idle and composites
  int microbatch = -1; ///< -1 for Idle, composites and hasNoMicrobatch kinds
  /// Sub-actions of OverlapFB / BatchedComm, in execution order; empty
  /// otherwise.
  std::vector<Action> parts;
  /// Optional duration in microseconds (JSON schedules may carry one).
  std::optional<double> durationUs;
  /// The 0-based cell of the schedule file this action came from (the CSV
  /// column - 1, the JSON array index); -1 when generated. Send/recv added by
  /// lowerCommunication take the cell of the compute action they serve, so
  /// diagnostics after lowering still point at the file. Not part of ==.
  int sourceCell = -1;
  /// A transfer's message tag, when the schedule names one (a plan JSON read
  /// back: runtimes match a receive to the first message from its source
  /// with its tag). Both ends of a transfer carry the same tag, and a rank's
  /// tags towards one peer in one direction are distinct (Validate.h rule
  /// 7). Not part of ==.
  std::optional<int64_t> tag;
  /// A receive of a finished plan read back: the receives to post when it is
  /// reached, in posting order, as indices into its rank's program counted
  /// primitive by primitive (each part of a composite and each idle slot
  /// counts one: the plan JSON's action index). [hpr.schedule.posts]
  /// (Validate.h). Not part of ==.
  std::optional<std::vector<int>> posts;

  bool operator==(const Action &other) const;
  bool operator!=(const Action &other) const { return !(*this == other); }
};

/// A whole schedule. `ranks[r]` is rank r's program in execution order; idle
/// slots are kept so that a CSV round-trips cell for cell.
struct Schedule {
  std::string name; ///< generator name or file stem
  int numRanks = 0;
  int numStages = 0;
  int numMicrobatches = 0;
  std::vector<int> stageToRank; ///< size numStages
  std::vector<std::vector<Action>> ranks;
};

} // namespace mlir::hpr::sched

#endif // HPR_SCHEDULE_SCHEDULE_H
