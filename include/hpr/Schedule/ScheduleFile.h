//===- ScheduleFile.h - Read a schedule file by extension -------*- C++ -*-===//
//
// One entry point for tools: `.csv` goes to the CSV reader, `.json` to the
// JSON reader.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SCHEDULE_SCHEDULEFILE_H
#define HPR_SCHEDULE_SCHEDULEFILE_H

#include "hpr/Schedule/Schedule.h"
#include "hpr/Schedule/ScheduleCsv.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace mlir::hpr::sched {

/// Reads `path` as a CSV (in `dialect`) or JSON schedule depending on its
/// extension (case-insensitive). An unreadable file or another extension is
/// an error naming the path.
llvm::Expected<Schedule> readScheduleFile(llvm::StringRef path,
                                          CsvDialect dialect);

} // namespace mlir::hpr::sched

#endif // HPR_SCHEDULE_SCHEDULEFILE_H
