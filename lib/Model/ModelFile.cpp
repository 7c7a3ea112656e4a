//===- ModelFile.cpp - Read a model file of any supported format ----------===//

#include "hpr/Model/ModelFile.h"
#include "hpr/Model/ModelJson.h"

#include "llvm/Support/DynamicLibrary.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cstdlib>

using namespace hpr::model;

/// The entry point libHPRTorchScript.so exports (TorchScriptEntry.cpp).
using ImportTorchScriptFn = bool (*)(const char *path,
                                     const TorchScriptOptions *options,
                                     std::vector<std::string> *warnings,
                                     ModelGraph *graph, std::string *error);

/// Imports through libHPRTorchScript.so, loaded on first use: LibTorch takes
/// about 0.4 s to load, which planning from a JSON model or from a schedule
/// alone should not pay. HPR_TORCHSCRIPT_LIBRARY overrides the build-tree
/// path compiled in.
static llvm::Expected<ModelGraph>
importTorchScriptOnDemand(llvm::StringRef path,
                          const TorchScriptOptions &options,
                          std::vector<std::string> *warnings) {
  const char *override = std::getenv("HPR_TORCHSCRIPT_LIBRARY");
  std::string library = override ? override : HPR_TORCHSCRIPT_LIBRARY;
  std::string loadError;
  auto handle = llvm::sys::DynamicLibrary::getPermanentLibrary(library.c_str(),
                                                               &loadError);
  void *symbol = handle.isValid()
                     ? handle.getAddressOfSymbol("hprImportTorchScript")
                     : nullptr;
  if (!symbol)
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        "%s: cannot load the TorchScript importer %s: %s", path.str().c_str(),
        library.c_str(),
        loadError.empty() ? "no hprImportTorchScript symbol"
                          : loadError.c_str());
  auto importFn = reinterpret_cast<ImportTorchScriptFn>(symbol);
  ModelGraph graph;
  std::string error;
  if (!importFn(path.str().c_str(), &options, warnings, &graph, &error))
    return llvm::createStringError(llvm::inconvertibleErrorCode(), error);
  return graph;
}

llvm::Expected<ModelGraph>
hpr::model::readModelFile(llvm::StringRef path,
                          const TorchScriptOptions &options,
                          std::vector<std::string> *warnings) {
  if (path.ends_with(".pt") || path.ends_with(".ir"))
    return importTorchScriptOnDemand(path, options, warnings);
  if (path.ends_with(".json")) {
    auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/true);
    if (!buffer)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "%s: cannot read: %s", path.str().c_str(),
                                     buffer.getError().message().c_str());
    return parseModelJson((*buffer)->getBuffer(), path);
  }
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      "%s: unknown model format; expected a file ending in .pt (TorchScript "
      "archive), .ir (TorchScript IR text) or .json (model JSON graph)",
      path.str().c_str());
}
