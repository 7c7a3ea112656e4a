//===- ScheduleCsv.h - torch.distributed.pipelining CSV schedules -*- C++ -*-=//
//
// Reads and writes pipeline schedules in the CSV format of
// torch.distributed.pipelining: one row per rank (row index = rank), one cell
// per action in execution order, an empty cell is an idle slot. Cells are
// parsed whole by a small hand-written lexer (not a prefix match), so that a
// cell like `2BW0` in the current dialect is an error instead of a silent
// misreading. See docs/schedules.md for the grammar.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SCHEDULE_SCHEDULECSV_H
#define HPR_SCHEDULE_SCHEDULECSV_H

#include "hpr/Schedule/Schedule.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <string>

namespace mlir::hpr::sched {

/// Which spelling of the backward actions a CSV file uses.
enum class CsvDialect {
  /// PyTorch since late 2024: F, I (dx), W (dw), B (full backward).
  Current,
  /// Older PyTorch / sail-sg zero-bubble: F, B (dx), W (dw), BW (full
  /// backward), plus combined comm cells such as `0SEND_F0_1RECV_B0`.
  Legacy
};

/// Parses one cell (already without its surrounding whitespace). On failure
/// the error message is `invalid action 'CELL': expected ...` without a
/// location; parseScheduleCsv prefixes `FILE:ROW:COL: `.
llvm::Expected<Action> parseAction(llvm::StringRef cell, CsvDialect dialect);

/// Parses a whole CSV schedule. Row r is rank r; numStages, numMicrobatches
/// and stageToRank are inferred from the actions (see inferScheduleShape).
/// `fileName` names the input in error messages, which read
/// `FILE:ROW:COL: invalid action '2BW0': expected ...` (1-based row = rank + 1,
/// column = cell index + 1). The schedule's name is the file name's stem.
llvm::Expected<Schedule> parseScheduleCsv(llvm::StringRef text,
                                          llvm::StringRef fileName,
                                          CsvDialect dialect);

/// Spells one action as a CSV cell (empty for Idle). In the current dialect a
/// BatchedComm, which has no current spelling, is written as its parts joined
/// by `_` (use printScheduleCsv to split it into cells instead).
std::string formatAction(const Action &action,
                         CsvDialect dialect = CsvDialect::Current);

/// Writes a schedule as CSV, one line per rank, each line ending in '\n'.
/// parseScheduleCsv(printScheduleCsv(s, d), ..., d) gives back the same cells.
/// In the current dialect a legacy BatchedComm is written as one cell per part.
std::string printScheduleCsv(const Schedule &schedule, CsvDialect dialect);

} // namespace mlir::hpr::sched

#endif // HPR_SCHEDULE_SCHEDULECSV_H
