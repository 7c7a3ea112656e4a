//===- ZipArchive.h - Read entries of a zip archive -------------*- C++ -*-===//
//
// PyTorch's archives (torch.jit.save `.pt`, torch.export.save `.pt2`) are zip
// files. libzip reads them: it checks the central directory against the
// local headers on open and each entry's CRC on read, so a truncated or
// damaged archive is an error here, never undefined behaviour downstream.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SUPPORT_ZIPARCHIVE_H
#define HPR_SUPPORT_ZIPARCHIVE_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mlir::hpr {

/// A zip archive opened from memory, read-only.
class ZipArchive {
public:
  /// Opens \p data (kept by the caller while the archive lives). Errors read
  /// `FILE: not a valid KIND (REASON)`, KIND being \p kind.
  static llvm::Expected<ZipArchive> open(llvm::StringRef data,
                                         llvm::StringRef fileName,
                                         llvm::StringRef kind = "zip archive");

  ZipArchive(ZipArchive &&) noexcept;
  ZipArchive &operator=(ZipArchive &&) noexcept;
  ~ZipArchive();

  /// Entry names in archive order.
  const std::vector<std::string> &names() const { return entryNames; }

  /// The bytes of entry \p name; refuses entries larger than \p maxBytes.
  llvm::Expected<std::string> read(llvm::StringRef name,
                                   uint64_t maxBytes = uint64_t(1) << 30);

private:
  struct Impl;
  ZipArchive(std::unique_ptr<Impl> impl, std::vector<std::string> names,
             std::string fileName);

  std::unique_ptr<Impl> impl;
  std::vector<std::string> entryNames;
  std::string fileName;
};

} // namespace mlir::hpr

#endif // HPR_SUPPORT_ZIPARCHIVE_H
