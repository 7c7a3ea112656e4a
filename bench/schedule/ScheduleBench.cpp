//===- ScheduleBench.cpp - Time import + validate + lower on big schedules ===//
//
// Usage:
//   hpr-schedule-bench generate NAME RANKS MICROBATCHES OUT.csv
//       writes a compute-only schedule from a built-in generator;
//   hpr-schedule-bench run FILE.csv|FILE.json
//       reads, validates, lowers and validates again, printing the time of
//       each step and the action counts.
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/Generators.h"
#include "hpr/Schedule/Lowering.h"
#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/ScheduleFile.h"
#include "hpr/Schedule/Validate.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <cstdlib>

using namespace mlir::hpr::sched;

namespace {

size_t countActions(const Schedule &s) {
  size_t n = 0;
  for (const auto &program : s.ranks)
    n += program.size();
  return n;
}

int fail(llvm::Error err) {
  llvm::errs() << "hpr-schedule-bench: " << llvm::toString(std::move(err))
               << "\n";
  return 1;
}

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

} // namespace

int main(int argc, char **argv) {
  if (argc == 6 && llvm::StringRef(argv[1]) == "generate") {
    auto s =
        generateSchedule(argv[2], {std::atoi(argv[3]), std::atoi(argv[4]), 0});
    if (!s)
      return fail(s.takeError());
    std::error_code ec;
    llvm::raw_fd_ostream out(argv[5], ec);
    if (ec)
      return fail(
          llvm::createStringError(ec, "%s: %s", argv[5], ec.message().c_str()));
    out << printScheduleCsv(*s, CsvDialect::Current);
    llvm::outs() << "wrote " << countActions(*s) << " cells to " << argv[5]
                 << "\n";
    return 0;
  }
  if (argc == 3 && llvm::StringRef(argv[1]) == "run") {
    auto total = std::chrono::steady_clock::now();
    auto t = std::chrono::steady_clock::now();
    auto s = readScheduleFile(argv[2], CsvDialect::Current);
    if (!s)
      return fail(s.takeError());
    double importS = secondsSince(t);
    t = std::chrono::steady_clock::now();
    if (auto err = validateSchedule(*s, argv[2]))
      return fail(std::move(err));
    double validateS = secondsSince(t);
    size_t before = countActions(*s);
    t = std::chrono::steady_clock::now();
    lowerCommunication(*s);
    double lowerS = secondsSince(t);
    double stepS = secondsSince(total);
    t = std::chrono::steady_clock::now();
    if (auto err = validateSchedule(*s, argv[2]))
      return fail(std::move(err));
    double revalidateS = secondsSince(t);
    llvm::outs() << llvm::format(
        "cells %zu, after lowering %zu\nimport %.3f s, validate %.3f s, "
        "lower %.3f s: import+validate+lower %.3f s\n"
        "validate lowered %.3f s\n",
        before, countActions(*s), importS, validateS, lowerS, stepS,
        revalidateS);
    return 0;
  }
  llvm::errs() << "usage: hpr-schedule-bench generate NAME RANKS "
                  "MICROBATCHES OUT.csv\n"
                  "       hpr-schedule-bench run FILE.csv|FILE.json\n";
  return 2;
}
