//===- InputFile.h - Read an input with a bound on its size -----*- C++ -*-===//
//
// Every file the tools read goes through readInputFile, so that no input can
// exhaust memory: llvm::MemoryBuffer::getFile reads a FIFO or a device such
// as /dev/zero until the allocation fails ("LLVM ERROR: out of memory"). The
// bounds are documented in docs/cli.md, "Input files".
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SUPPORT_INPUTFILE_H
#define HPR_SUPPORT_INPUTFILE_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cstdint>
#include <memory>

namespace mlir::hpr {

/// The largest regular text file read (model and schedule JSON, CSV, MLIR,
/// TorchScript IR, sidecars): 1 GiB.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t(1) << 30;
/// The largest regular archive file read (.pt, .pt2): 16 GiB. Such a file is
/// mapped, not copied, and its entries are bounded again when inflated.
inline constexpr uint64_t kMaxArchiveFileBytes = uint64_t(16) << 30;
/// The most read from an input that is not a regular file (standard input, a
/// FIFO, a character device), whose size is unknown until its end: 256 MiB.
inline constexpr uint64_t kMaxStreamedInputBytes = uint64_t(256) << 20;

/// What an input holds, which sets its bound and how it is read.
enum class InputKind {
  /// Text, read into a null-terminated buffer (the parsers rely on it);
  /// regular files up to kMaxTextFileBytes.
  Text,
  /// A zip archive, mapped without a terminator; regular files up to
  /// kMaxArchiveFileBytes.
  Archive,
};

/// Reads all of \p path (`-`: standard input). A regular file larger than
/// its kind's bound is refused before it is read; anything else (standard
/// input, a FIFO, a device) is read up to kMaxStreamedInputBytes and refused
/// beyond that. Errors read `PATH: cannot read[ WHAT]: REASON`, \p what
/// naming the kind of file (e.g. "schedule file").
llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readInputFile(llvm::StringRef path, llvm::StringRef what = "",
              InputKind kind = InputKind::Text);

} // namespace mlir::hpr

#endif // HPR_SUPPORT_INPUTFILE_H
