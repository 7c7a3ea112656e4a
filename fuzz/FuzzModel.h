//===- FuzzModel.h - What the model fuzzers do with an import ---*- C++ -*-===//
//
// Every model importer's target ends alike: a rejected input is fine, and
// what imports is partitioned into 1..4 stages, the planner's next step.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_FUZZ_FUZZMODEL_H
#define HPR_FUZZ_FUZZMODEL_H

#include "FuzzInput.h"

#include "hpr/Model/Partition.h"

namespace mlir::hpr::fuzz {

inline void partitionImported(llvm::Expected<model::ModelGraph> graph) {
  if (!graph) {
    llvm::consumeError(graph.takeError());
    return;
  }
  for (int stages = 1; stages <= 4; ++stages)
    ignore(model::partitionModel(*graph, stages, ""));
}

} // namespace mlir::hpr::fuzz

#endif // HPR_FUZZ_FUZZMODEL_H
