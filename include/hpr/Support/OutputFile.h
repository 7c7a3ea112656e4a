//===- OutputFile.h - Write under the output-file policy --------*- C++ -*-===//
//
// Every file the tools write goes through OutputFile, which implements the
// project's output-file policy (docs/cli.md, "Output files"; the Python
// tools implement the same text; docs/rules.md, `hpr.output.*`):
//
//   hpr.output.stdout-dash: `-` is standard output; an empty path is a
//     usage error.
//   hpr.output.follow-symlinks: symlinks are followed; a loop is an error,
//     the link is never replaced.
//   hpr.output.no-directory: an existing directory is an error.
//   hpr.output.special-files: an existing file that is not a regular file (a
//     device such as /dev/null or /dev/full, a FIFO) is opened as it is,
//     without creating or truncating, and streamed into; a write error is an
//     error.
//   hpr.output.atomic-replace: a regular file, or a new path, is written to a
//     temporary file in its directory, flushed, checked, fsync'ed, and
//     renamed over the target only when everything succeeded; on any failure
//     the temporary is removed and the target is untouched. An existing file
//     keeps its permission bits. With several outputs, all are written before
//     any is renamed (commitOutputs).
//   hpr.output.not-an-input: an output that is the same regular file as an
//     input, or as another output (device and inode, after following
//     symlinks), is a usage error.
//
// All checks happen in OutputFile::open and refuseInput/refuseSameAs, which
// a tool calls before any work.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SUPPORT_OUTPUTFILE_H
#define HPR_SUPPORT_OUTPUTFILE_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FileSystem/UniqueID.h"
#include "llvm/Support/raw_ostream.h"

#include <memory>
#include <optional>
#include <string>

namespace mlir::hpr {

/// A mistake on the command line rather than in a file: tools exit with 2
/// on it (1 on every other error).
class UsageError : public llvm::ErrorInfo<UsageError> {
public:
  static char ID;
  explicit UsageError(std::string message) : message(std::move(message)) {}
  void log(llvm::raw_ostream &os) const override { os << message; }
  std::error_code convertToErrorCode() const override {
    return llvm::inconvertibleErrorCode();
  }

private:
  std::string message;
};

/// One output of a tool, opened before the work, written, then committed.
class OutputFile {
public:
  /// Checks \p path, given by \p flag (a flag such as "-o", named in every
  /// message), under the policy's first four rules (stdout-dash to
  /// special-files) and opens it: standard output, the file itself when it is
  /// not a regular file, otherwise a new temporary file beside the target (so
  /// a directory that cannot be written is found before any work). An empty
  /// path is a UsageError.
  static llvm::Expected<std::unique_ptr<OutputFile>> open(llvm::StringRef flag,
                                                          llvm::StringRef path);

  /// Removes the temporary file unless commit() renamed it.
  ~OutputFile();
  OutputFile(const OutputFile &) = delete;
  OutputFile &operator=(const OutputFile &) = delete;

  /// hpr.output.not-an-input: a UsageError naming both flags when the input
  /// \p path, given by \p flag, is the regular file this output would
  /// replace.
  llvm::Error refuseInput(llvm::StringRef flag, llvm::StringRef path) const;
  /// hpr.output.not-an-input for two outputs of one run.
  llvm::Error refuseSameAs(const OutputFile &other) const;

  /// Where the output is written.
  llvm::raw_ostream &os() { return *stream; }

  /// Flushes the output and checks every write; a temporary file is then
  /// fsync'ed and closed. Errors read `FLAG PATH: cannot write: REASON`.
  llvm::Error finish();
  /// Renames the finished temporary over the target (nothing to do for
  /// standard output and streams).
  llvm::Error commit();

private:
  enum class Kind { Stdout, Stream, File };
  OutputFile(std::string flag, std::string path, Kind kind);
  static llvm::Expected<std::unique_ptr<OutputFile>>
  openStream(std::unique_ptr<OutputFile> out, llvm::StringRef target);
  llvm::Error failure(const llvm::Twine &what) const;
  void discard();

  std::string flag, path;
  Kind kind;
  /// What rename replaces (symlinks followed; its directory as an absolute
  /// path without links, so that two names of one new file compare equal)
  /// and the temporary beside it.
  std::string target, temporary;
  /// The target's identity when it is an existing regular file.
  std::optional<llvm::sys::fs::UniqueID> identity;
  /// The stream and temporary file this object owns (none for stdout).
  int fd = -1;
  std::unique_ptr<llvm::raw_fd_ostream> owned;
  llvm::raw_fd_ostream *stream = nullptr;
};

/// hpr.output.atomic-replace for several outputs: finishes every one, then
/// renames them, so a failure in any leaves every target as it was.
llvm::Error commitOutputs(llvm::ArrayRef<OutputFile *> outputs);

} // namespace mlir::hpr

#endif // HPR_SUPPORT_OUTPUTFILE_H
