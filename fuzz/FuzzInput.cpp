//===- FuzzInput.cpp - Helpers shared by the libFuzzer targets -----------===//

#include "FuzzInput.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>

std::string mlir::hpr::fuzz::writeTempFile(const uint8_t *data, size_t size,
                                           llvm::StringRef suffix) {
  llvm::SmallString<128> path;
  llvm::sys::path::system_temp_directory(/*ErasedOnReboot=*/true, path);
  llvm::sys::path::append(
      path, "hpr-fuzz-" + std::to_string(llvm::sys::Process::getProcessId()) +
                suffix);
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec);
  if (ec) {
    llvm::errs() << "hpr-fuzz: cannot write " << path << ": " << ec.message()
                 << "\n";
    std::abort();
  }
  os << asText(data, size);
  return std::string(path);
}
