//===- FuzzInput.h - Helpers shared by the libFuzzer targets ----*- C++ -*-===//
//
// The targets feed libFuzzer's bytes to one parser each; an input the parser
// rejects is fine (its llvm::Error is consumed), a crash, a sanitizer report
// or a hang is a bug. Some importers read files only: writeTempFile gives
// them one.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_FUZZ_FUZZINPUT_H
#define HPR_FUZZ_FUZZINPUT_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <string>

namespace mlir::hpr::fuzz {

inline llvm::StringRef asText(const uint8_t *data, size_t size) {
  return llvm::StringRef(reinterpret_cast<const char *>(data), size);
}

/// Consumes the result of a parser: rejected input is not a finding.
template <typename T> void ignore(llvm::Expected<T> result) {
  if (!result)
    llvm::consumeError(result.takeError());
}
inline void ignore(llvm::Error error) { llvm::consumeError(std::move(error)); }

/// Writes `data` to a file named `hpr-fuzz-<pid><suffix>` in the temporary
/// directory (the same file for every input of a run) and returns its path.
std::string writeTempFile(const uint8_t *data, size_t size,
                          llvm::StringRef suffix);

} // namespace mlir::hpr::fuzz

#endif // HPR_FUZZ_FUZZINPUT_H
