//===- ScheduleCsvFuzzer.cpp - hpr-fuzz-schedule-csv ---------------------===//
//
// Schedule CSV in both dialects, then validation of what parses.
//
//===----------------------------------------------------------------------===//

#include "FuzzInput.h"

#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/Validate.h"

using namespace mlir::hpr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (sched::CsvDialect dialect :
       {sched::CsvDialect::Current, sched::CsvDialect::Legacy}) {
    auto schedule =
        sched::parseScheduleCsv(fuzz::asText(data, size), "fuzz.csv", dialect);
    if (!schedule) {
      llvm::consumeError(schedule.takeError());
      continue;
    }
    fuzz::ignore(sched::validateSchedule(*schedule, "fuzz.csv"));
  }
  return 0;
}
