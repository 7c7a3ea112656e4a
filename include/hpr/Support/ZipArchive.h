//===- ZipArchive.h - Read entries of a zip archive -------------*- C++ -*-===//
//
// PyTorch's archives (torch.jit.save `.pt`, torch.export.save `.pt2`) are zip
// files. minizip (zlib's zip library) reads them: an archive without a
// readable central directory does not open, names listed twice are refused,
// each entry's local header is checked against the directory when it is
// opened and its CRC once it is read, so a truncated or damaged archive is
// an error here, never undefined behaviour downstream.
//
// What a read inflates is bounded (docs/models.md, "torch.export import"), so
// that a small archive cannot make the reader allocate gigabytes: entries
// read from one archive inflate to at most kMaxInflatedBytes together, and an
// entry larger than kRatioFloor may inflate to at most kMaxRatio times its
// compressed size. Both are checked against the central directory before an
// entry is read, and again while it inflates (a directory can lie): memory
// grows with the bytes that arrive, never with what the directory claims.
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
  /// Bytes all reads of one archive may inflate together.
  static constexpr uint64_t kMaxInflatedBytes = uint64_t(256) << 20;
  /// Largest inflated / compressed size of one entry...
  static constexpr uint64_t kMaxRatio = 100;
  /// ...larger than this (smaller entries cost no memory worth bounding).
  static constexpr uint64_t kRatioFloor = uint64_t(1) << 20;

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

  /// The bytes of entry \p name; refuses an entry larger than \p maxBytes or
  /// than what is left of kMaxInflatedBytes, and one past kMaxRatio.
  llvm::Expected<std::string> read(llvm::StringRef name,
                                   uint64_t maxBytes = kMaxInflatedBytes);

private:
  struct Impl;
  ZipArchive(std::unique_ptr<Impl> impl, std::vector<std::string> names,
             std::string fileName);

  std::unique_ptr<Impl> impl;
  std::vector<std::string> entryNames;
  std::string fileName;
  uint64_t inflatedBytes = 0; ///< what reads have returned so far
};

} // namespace mlir::hpr

#endif // HPR_SUPPORT_ZIPARCHIVE_H
