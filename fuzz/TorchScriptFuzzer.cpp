//===- TorchScriptFuzzer.cpp - hpr-fuzz-torchscript-ir and -pt -----------===//
//
// The TorchScript importer reads files: each input is written to a temporary
// `.ir` (IR text) or `.pt` (archive) file and imported with the default
// options. HPR_FUZZ_SUFFIX, set by the build, says which. Archives go through
// readModelFile, as the planner reads them: LibTorch's archive reader can
// crash on damaged bytes, and readModelFile imports in a child process, so
// such an input must come back as an error. IR text is imported in process
// (thousands of inputs a second instead of a few).
//
//===----------------------------------------------------------------------===//

#include "FuzzInput.h"

#include "hpr/Model/ModelFile.h"
#include "hpr/Model/TorchScriptImport.h"

#include "llvm/ADT/StringRef.h"

using namespace mlir::hpr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string path = fuzz::writeTempFile(data, size, HPR_FUZZ_SUFFIX);
  std::vector<std::string> warnings;
  if (llvm::StringRef(HPR_FUZZ_SUFFIX) == ".pt")
    fuzz::ignore(
        model::readModelFile(path, model::TorchScriptOptions(), &warnings));
  else
    fuzz::ignore(
        model::importTorchScript(path, model::TorchScriptOptions(), &warnings));
  return 0;
}
