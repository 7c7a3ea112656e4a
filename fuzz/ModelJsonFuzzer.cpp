//===- ModelJsonFuzzer.cpp - hpr-fuzz-model-json -------------------------===//
//
// Model JSON, then a balanced partition into 1..4 stages of what parses.
//
//===----------------------------------------------------------------------===//

#include "FuzzModel.h"

#include "hpr/Model/ModelJson.h"

using namespace mlir::hpr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz::partitionImported(
      model::parseModelJson(fuzz::asText(data, size), "fuzz.json"));
  return 0;
}
