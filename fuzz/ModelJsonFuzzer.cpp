//===- ModelJsonFuzzer.cpp - hpr-fuzz-model-json -------------------------===//
//
// Model JSON, then a balanced partition into 1..4 stages of what parses.
//
//===----------------------------------------------------------------------===//

#include "FuzzInput.h"

#include "hpr/Model/ModelJson.h"
#include "hpr/Model/Partition.h"

using namespace hpr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto graph = model::parseModelJson(fuzz::asText(data, size), "fuzz.json");
  if (!graph) {
    llvm::consumeError(graph.takeError());
    return 0;
  }
  for (int stages = 1; stages <= 4; ++stages)
    fuzz::ignore(model::partitionModel(*graph, stages, ""));
  return 0;
}
