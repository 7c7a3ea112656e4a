//===- TorchScriptEntry.cpp - C entry point of libHPRTorchScript.so ------===//
//
// readModelFile (ModelFile.cpp) loads this library only when a TorchScript
// model is read and finds the importer through this unmangled symbol.
//
//===----------------------------------------------------------------------===//

#include "hpr/Model/TorchScriptImport.h"

using namespace mlir::hpr::model;

extern "C" __attribute__((visibility("default"))) bool
hprImportTorchScript(const char *path, const TorchScriptOptions *options,
                     std::vector<std::string> *warnings, ModelGraph *graph,
                     std::string *error) {
  // Nothing may unwind through this C boundary: LibTorch and nlohmann throw.
  try {
    llvm::Expected<ModelGraph> imported =
        importTorchScript(path, *options, warnings);
    if (!imported) {
      *error = llvm::toString(imported.takeError());
      return false;
    }
    *graph = std::move(*imported);
    return true;
  } catch (const std::exception &e) {
    *error = std::string(path) + ": cannot import: " + e.what();
    return false;
  }
}
