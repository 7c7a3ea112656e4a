//===- ExportedProgramFuzzer.cpp - hpr-fuzz-pt2, hpr-fuzz-pt2-program -----===//
//
// torch.export input: with HPR_FUZZ_ARCHIVE a whole `.pt2` (minizip, then the
// program reader), else the serialized program JSON alone; then a balanced
// partition into 1..4 stages of what imports.
//
//===----------------------------------------------------------------------===//

#include "FuzzModel.h"

#include "hpr/Model/ExportedProgramImport.h"

using namespace mlir::hpr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<std::string> warnings;
#ifdef HPR_FUZZ_ARCHIVE
  std::string path = fuzz::writeTempFile(data, size, ".pt2");
  fuzz::partitionImported(
      model::importExportedProgram(path, /*regionDepth=*/1, warnings));
#else
  fuzz::partitionImported(model::importExportedProgramJson(
      fuzz::asText(data, size), "fuzz.json", /*regionDepth=*/1, warnings));
#endif
  return 0;
}
