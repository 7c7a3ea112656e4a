//===- ScheduleJsonFuzzer.cpp - hpr-fuzz-schedule-json -------------------===//
//
// Schedule JSON, then validation of what parses.
//
//===----------------------------------------------------------------------===//

#include "FuzzInput.h"

#include "hpr/Schedule/ScheduleJson.h"
#include "hpr/Schedule/Validate.h"

using namespace mlir::hpr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto schedule =
      sched::parseScheduleJson(fuzz::asText(data, size), "fuzz.json");
  if (!schedule) {
    llvm::consumeError(schedule.takeError());
    return 0;
  }
  fuzz::ignore(sched::validateSchedule(*schedule, "fuzz.json"));
  return 0;
}
