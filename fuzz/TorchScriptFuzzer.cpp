//===- TorchScriptFuzzer.cpp - hpr-fuzz-torchscript-ir and -pt -----------===//
//
// The TorchScript importer reads files: each input is written to a temporary
// `.ir` (IR text) or `.pt` (archive) file and imported with the default
// options. HPR_FUZZ_SUFFIX, set by the build, says which.
//
//===----------------------------------------------------------------------===//

#include "FuzzInput.h"

#include "hpr/Model/TorchScriptImport.h"

using namespace hpr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string path = fuzz::writeTempFile(data, size, HPR_FUZZ_SUFFIX);
  std::vector<std::string> warnings;
  fuzz::ignore(
      model::importTorchScript(path, model::TorchScriptOptions(), &warnings));
  return 0;
}
