//===- InputFile.cpp - Read an input file with a bound on its size --------===//

#include "hpr/Support/InputFile.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

using namespace llvm;

/// `N bytes` with the bound's unit when it is a whole number of MiB or GiB.
static std::string formatBound(uint64_t bytes) {
  if (bytes % (uint64_t(1) << 30) == 0)
    return formatv("{0} GiB", bytes >> 30).str();
  if (bytes % (uint64_t(1) << 20) == 0)
    return formatv("{0} MiB", bytes >> 20).str();
  return formatv("{0} bytes", bytes).str();
}

Expected<std::unique_ptr<MemoryBuffer>>
mlir::hpr::readInputFile(StringRef path, StringRef what, InputKind kind) {
  auto fail = [&](const Twine &reason) -> Error {
    return createStringError(inconvertibleErrorCode(),
                             path + ": cannot read" +
                                 (what.empty() ? "" : " ") + what + ": " +
                                 reason);
  };
  bool isStdin = path == "-";
  sys::fs::file_t fd;
  if (isStdin) {
    fd = sys::fs::getStdinHandle();
  } else {
    Expected<sys::fs::file_t> opened = sys::fs::openNativeFileForRead(path);
    if (!opened)
      return fail(toString(opened.takeError()));
    fd = *opened;
  }
  auto closeFd = make_scope_exit([&] {
    if (!isStdin)
      (void)sys::fs::closeFile(fd);
  });
  sys::fs::file_status status;
  if (std::error_code ec = sys::fs::status(fd, status))
    return fail(ec.message());
  if (status.type() == sys::fs::file_type::directory_file)
    return fail("is a directory");

  // A regular file says its size; /proc files say 0 and are read as streams.
  if (status.type() == sys::fs::file_type::regular_file &&
      status.getSize() > 0) {
    uint64_t bound =
        kind == InputKind::Text ? kMaxTextFileBytes : kMaxArchiveFileBytes;
    if (status.getSize() > bound)
      return fail(formatv("it holds {0} bytes, more than the {1} read from "
                          "such a file",
                          status.getSize(), formatBound(bound)));
    auto buffer = MemoryBuffer::getOpenFile(fd, path, status.getSize(),
                                            /*RequiresNullTerminator=*/kind ==
                                                InputKind::Text);
    if (!buffer)
      return fail(buffer.getError().message());
    return std::move(*buffer);
  }

  // Standard input, a FIFO or a device (/dev/zero never ends): read in
  // chunks, one byte past the bound to tell a full stream from a longer one.
  SmallVector<char, 0> data;
  constexpr size_t chunk = 1 << 16;
  while (data.size() <= kMaxStreamedInputBytes) {
    size_t start = data.size();
    data.resize_for_overwrite(start + chunk);
    Expected<size_t> got = sys::fs::readNativeFile(
        fd, MutableArrayRef<char>(data).drop_front(start));
    if (!got)
      return fail(toString(got.takeError()));
    data.truncate(start + *got);
    if (*got == 0)
      return MemoryBuffer::getMemBufferCopy(StringRef(data.data(), start),
                                            path);
  }
  return fail(formatv("it is not a regular file and holds more than the {0} "
                      "read from such an input",
                      formatBound(kMaxStreamedInputBytes)));
}
