//===- Validate.h - Pipeline schedule validation ----------------*- C++ -*-===//
//
// Checks that a schedule is a correct training step: PyTorch's rules for
// pipeline schedules plus ordering, pairing and deadlock freedom.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SCHEDULE_VALIDATE_H
#define HPR_SCHEDULE_VALIDATE_H

#include "hpr/Schedule/Schedule.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <string>
#include <utility>
#include <vector>

namespace mlir::hpr::sched {

/// Validates `schedule` and reports every violation found (one per line,
/// at most 50 then a count), each as
/// `FILE: rank R, action K (TEXT): what is wrong` with 0-based rank and
/// action index (the CSV column minus one); a composite's part is named as
/// `action K part P`. Rules (docs/schedules.md, "Validation"):
///  1. shape: numRanks == ranks.size(), stages/microbatches in range, each
///     stage on exactly one rank, matching stageToRank;
///  2. every (stage, microbatch) forwarded exactly once;
///  3. every (stage, microbatch) backpropagated exactly once: one B, or one I
///     and one W (this implies PyTorch's B + (I + W) / 2 == microbatches);
///  4. I and B after their F; W after its I; RECOMPUTE after its F;
///  5. if the schedule has communication: every cross-rank transfer has
///     exactly one SEND (after its producer) and one RECV (before its
///     consumer), and there are no other transfers;
///  6. the unit-time simulation finishes (no deadlock) — only checked when
///     rules 1-5 and 7 hold;
///  7. message tags, where transfers carry them (a plan read back): every
///     transfer has one, both ends of a transfer agree, and a rank's sends to
///     one peer (and its receives from one peer) all have different tags —
///     a runtime matches a receive to the first message from its source with
///     its tag;
///  8. [hpr.schedule.reduce-grad] REDUCE_GRAD at most once per stage, after
///     the stage's last W and B: an earlier one reduces gradients that later
///     Ws still add to, a second one scales them twice; in a finished plan
///     exactly once per stage that has a W or B;
///  9. [hpr.schedule.posts] receive posting, where receives carry `posts` (a
///     plan read back; in a finished plan every receive): each receive is
///     posted exactly once, by itself or by a receive before it, and a rank
///     posts its receives from one peer in the order that peer sends the
///     messages (torch's point-to-point ops carry no tag and match in posting
///     order). Its violations do not hold up rule 6 (posting early never
///     blocks).
/// A message that names its rule ends with the rule's tag
/// (hpr/Support/Rules.h).
llvm::Error validateSchedule(const Schedule &schedule,
                             llvm::StringRef fileName);

/// What the schedule is checked as.
struct ValidateOptions {
  /// A finished plan (a plan JSON read back), not a schedule to plan: every
  /// stage with a W or B has its REDUCE_GRAD ([hpr.schedule.reduce-grad]) and
  /// every receive is posted ([hpr.schedule.posts]).
  bool finishedPlan = false;
};

/// One violation of the rules above, for callers that report it at their own
/// location of the action (the hpr IR's communication check).
struct Violation {
  /// The action it is about (rank, action index); -1 when it concerns the
  /// schedule as a whole.
  int rank = -1;
  int index = -1;
  /// `rank R, action K (TEXT): what is wrong`, or the schedule-wide message.
  std::string message;
  /// Further actions it involves: a deadlock's other waiting ranks.
  std::vector<std::pair<int, int>> related;
};

/// The violations validateSchedule reports, at most 50; `dropped` counts the
/// rest.
struct Violations {
  std::vector<Violation> list;
  size_t dropped = 0;
};
Violations findViolations(const Schedule &schedule,
                          ValidateOptions options = {});

} // namespace mlir::hpr::sched

#endif // HPR_SCHEDULE_VALIDATE_H
