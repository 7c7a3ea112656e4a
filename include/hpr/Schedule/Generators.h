//===- Generators.h - Built-in pipeline schedules ---------------*- C++ -*-===//
//
// Generates the compute-only programs of well-known pipeline schedules,
// following torch.distributed.pipelining where PyTorch has the schedule.
// Callers add communication with lowerCommunication().
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SCHEDULE_GENERATORS_H
#define HPR_SCHEDULE_GENERATORS_H

#include "hpr/Schedule/Schedule.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace mlir::hpr::sched {

/// Size of a generated schedule.
struct GeneratorOptions {
  int ranks = 1;
  int microbatches = 1;
  /// Stages per rank; 0 picks the schedule's default (1 for gpipe, 1f1b and
  /// zb-h1, 2 for interleaved-1f1b, zbv and dualpipev).
  int stagesPerRank = 0;
};

/// Generates schedule `name` (one of generatorNames()). Unsupported sizes and
/// unknown names fail with a message saying what is required. Idle cells that
/// PyTorch's generator emits are kept.
llvm::Expected<Schedule> generateSchedule(llvm::StringRef name,
                                          const GeneratorOptions &options);

/// `gpipe`, `1f1b`, `interleaved-1f1b`, `zb-h1`, `zbv`, `dualpipev`.
llvm::ArrayRef<llvm::StringLiteral> generatorNames();

} // namespace mlir::hpr::sched

#endif // HPR_SCHEDULE_GENERATORS_H
