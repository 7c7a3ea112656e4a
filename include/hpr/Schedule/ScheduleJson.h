//===- ScheduleJson.h - JSON pipeline schedules -----------------*- C++ -*-===//
//
// The JSON form of a schedule (format `hp-recompute-schedule`, version 1): the
// same content as a CSV schedule plus optional per-action `duration_us`.
// Documented in docs/schedules.md; JSON Schema in
// docs/schemas/schedule.schema.json.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SCHEDULE_SCHEDULEJSON_H
#define HPR_SCHEDULE_SCHEDULEJSON_H

#include "hpr/Schedule/Schedule.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <string>

namespace mlir::hpr::sched {

/// Parses a JSON schedule. Errors name the JSON path, e.g.
/// `FILE: /ranks/1/actions/3/microbatch: expected a non-negative integer`;
/// syntax errors give `FILE:LINE:COL: invalid JSON: ...`. Shape fields that
/// are absent are inferred from the actions; present ones are checked.
llvm::Expected<Schedule> parseScheduleJson(llvm::StringRef text,
                                           llvm::StringRef fileName);

/// Writes a schedule as JSON (one action object per line); parseScheduleJson
/// reads it back to an equal schedule.
std::string printScheduleJson(const Schedule &schedule);

} // namespace mlir::hpr::sched

#endif // HPR_SCHEDULE_SCHEDULEJSON_H
