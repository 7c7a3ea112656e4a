//===- CrashingImporter.cpp - A TorchScript importer that crashes --------===//
//
// Stands in for libHPRTorchScript.so (HPR_TORCHSCRIPT_LIBRARY) in
// torchscript-crash.test: its entry point dies with SIGSEGV, as LibTorch's
// archive reader can on a damaged .pt, so the test sees what the planner does
// when the importer crashes.
//
//===----------------------------------------------------------------------===//

#include <csignal>
#include <string>
#include <vector>

extern "C" __attribute__((visibility("default"))) bool
hprImportTorchScript(const char *, const void *, std::vector<std::string> *,
                     void *, std::string *) {
  std::raise(SIGSEGV);
  return false;
}
