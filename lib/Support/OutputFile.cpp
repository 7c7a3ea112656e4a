//===- OutputFile.cpp - Write an output under the output-file policy -----===//
//
// The rule numbers cited below are those of OutputFile.h (and of docs/cli.md,
// "Output files").
//
//===----------------------------------------------------------------------===//

#include "hpr/Support/OutputFile.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Signals.h"

#include <cerrno>
#include <climits>
#include <csignal>
#include <unistd.h>

using namespace llvm;
using namespace mlir::hpr;
namespace fs = llvm::sys::fs;

char UsageError::ID;

/// As many links as Linux follows in one path before ELOOP.
static constexpr unsigned kMaxSymlinkHops = 40;

static std::error_code lastError() {
  return std::error_code(errno, std::generic_category());
}

/// A write past `ulimit -f` raises SIGXFSZ, whose default action (and LLVM's
/// crash handler, which re-raises it) kills the process with the temporary
/// left behind; ignored, the write fails with EFBIG and is reported
/// (hpr.output.atomic-replace). Called after RemoveFileOnSignal, which installs
/// LLVM's handlers once.
static void ignoreFileSizeSignal() {
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGXFSZ, &ignore, nullptr);
}

OutputFile::OutputFile(std::string flag, std::string path, Kind kind)
    : flag(std::move(flag)), path(std::move(path)), kind(kind) {}

OutputFile::~OutputFile() { discard(); }

Error OutputFile::failure(const Twine &what) const {
  return createStringError(inconvertibleErrorCode(),
                           flag + " " + path + ": " + what);
}

void OutputFile::discard() {
  if (stream) {
    // What is left in the buffer goes nowhere that matters now; the stream
    // must not hold an error when destroyed (LLVM reports it as fatal).
    stream->flush();
    stream->clear_error();
  }
  owned.reset();
  stream = nullptr;
  if (fd >= 0)
    ::close(fd);
  fd = -1;
  if (!temporary.empty()) {
    (void)fs::remove(temporary);
    sys::DontRemoveFileOnSignal(temporary);
    temporary.clear();
  }
}

/// hpr.output.special-files: \p target is opened as it is, neither created nor
/// truncated.
Expected<std::unique_ptr<OutputFile>>
OutputFile::openStream(std::unique_ptr<OutputFile> out, StringRef target) {
  out->kind = Kind::Stream;
  if (std::error_code ec = fs::openFileForWrite(
          target, out->fd, fs::CD_OpenExisting, fs::OF_None))
    return out->failure(ec.message());
  out->owned = std::make_unique<raw_fd_ostream>(out->fd,
                                                /*shouldClose=*/false);
  out->stream = out->owned.get();
  ignoreFileSizeSignal();
  return out;
}

Expected<std::unique_ptr<OutputFile>> OutputFile::open(StringRef flag,
                                                       StringRef path) {
  // hpr.output.stdout-dash.
  if (path.empty())
    return make_error<UsageError>(
        (flag + ": expected a file name, or - for standard output; got an "
                "empty string")
            .str());
  std::unique_ptr<OutputFile> out(
      new OutputFile(flag.str(), path.str(), Kind::Stdout));
  if (path == "-") {
    out->stream = &outs();
    ignoreFileSizeSignal();
    return out;
  }

  // hpr.output.special-files first, through the kernel's own resolution:
  // /dev/stdout is a link to /proc/self/fd/1, whose target (`pipe:[N]`) names
  // no path.
  fs::file_status followed;
  if (!fs::status(path, followed, /*Follow=*/true) && fs::exists(followed) &&
      followed.type() != fs::file_type::regular_file &&
      followed.type() != fs::file_type::directory_file)
    return openStream(std::move(out), path);

  // hpr.output.follow-symlinks: the last component's links are followed here,
  // so that a dangling link names the file to create and a loop is found (the
  // kernel follows the links among the directories).
  SmallString<256> resolved(path);
  fs::file_status status;
  bool exists = false;
  for (unsigned hops = 0;; ++hops) {
    std::error_code ec = fs::status(resolved, status, /*Follow=*/false);
    if (ec == std::errc::no_such_file_or_directory)
      break;
    if (ec)
      return out->failure(ec.message());
    if (status.type() != fs::file_type::symlink_file) {
      exists = true;
      break;
    }
    if (hops == kMaxSymlinkHops)
      return out->failure(
          std::error_code(ELOOP, std::generic_category()).message() +
          "; the link is left as it is");
    char link[PATH_MAX];
    ssize_t length = ::readlink(resolved.c_str(), link, sizeof(link));
    if (length < 0)
      return out->failure(lastError().message());
    StringRef linked(link, length);
    if (sys::path::is_absolute(linked)) {
      resolved = linked;
    } else {
      SmallString<256> next(sys::path::parent_path(resolved));
      sys::path::append(next, linked);
      resolved = next;
    }
  }

  // hpr.output.no-directory.
  if (exists && status.type() == fs::file_type::directory_file)
    return out->failure("is a directory");

  // hpr.output.special-files: a special file that appeared since the check
  // above.
  if (exists && status.type() != fs::file_type::regular_file)
    return openStream(std::move(out), resolved);

  // hpr.output.atomic-replace: a temporary beside the target, with the target's
  // permission bits when it exists (0666 less the umask when it is new).
  out->kind = Kind::File;
  if (exists)
    out->identity = status.getUniqueID();
  StringRef directory = sys::path::parent_path(resolved);
  if (directory.empty())
    directory = ".";
  SmallString<256> target;
  if (std::error_code ec = fs::real_path(directory, target))
    return out->failure("cannot create a file in " + directory + ": " +
                        ec.message());
  sys::path::append(target, sys::path::filename(resolved));
  out->target = std::string(target);
  SmallString<256> temporary;
  if (std::error_code ec = fs::createUniqueFile(
          out->target + ".tmp-%%%%%%", out->fd, temporary, fs::OF_None))
    return out->failure("cannot create a file in " + directory + ": " +
                        ec.message());
  out->temporary = std::string(temporary);
  sys::RemoveFileOnSignal(out->temporary);
  ignoreFileSizeSignal();
  if (exists)
    if (std::error_code ec = fs::setPermissions(out->fd, status.permissions()))
      return out->failure("cannot set the permissions of a file in " +
                          directory + ": " + ec.message());
  out->owned = std::make_unique<raw_fd_ostream>(out->fd, /*shouldClose=*/false);
  out->stream = out->owned.get();
  return out;
}

Error OutputFile::refuseInput(StringRef inputFlag, StringRef inputPath) const {
  fs::file_status status;
  if (!identity || inputPath == "-" || fs::status(inputPath, status) ||
      status.type() != fs::file_type::regular_file ||
      status.getUniqueID() != *identity)
    return Error::success(); // a missing input is its reader's to report
  return make_error<UsageError>(
      (Twine(flag) + " " + path + " is the same file as " + inputFlag + " " +
       inputPath +
       ": writing the output would destroy the input; write it "
       "elsewhere")
          .str());
}

Error OutputFile::refuseSameAs(const OutputFile &other) const {
  bool same = kind == Kind::File && other.kind == Kind::File &&
              (target == other.target ||
               (identity && other.identity && *identity == *other.identity));
  if (!same)
    return Error::success();
  return make_error<UsageError>(flag + " " + path + " and " + other.flag + " " +
                                other.path +
                                " are the same file; give them different "
                                "names");
}

Error OutputFile::finish() {
  if (!stream)
    return failure("already finished"); // a bug of the caller
  stream->flush();
  std::error_code ec = stream->error();
  stream->clear_error();
  owned.reset();
  stream = nullptr;
  if (kind == Kind::File && !ec && ::fsync(fd) != 0)
    ec = lastError();
  if (fd >= 0 && ::close(fd) != 0 && !ec)
    ec = lastError();
  fd = -1;
  if (ec) {
    discard();
    return failure("cannot write: " + ec.message() +
                   (kind == Kind::File ? "; nothing was replaced" : ""));
  }
  return Error::success();
}

Error OutputFile::commit() {
  if (kind != Kind::File)
    return Error::success();
  if (std::error_code ec = fs::rename(temporary, target)) {
    discard();
    return failure("cannot replace it: " + ec.message());
  }
  sys::DontRemoveFileOnSignal(temporary);
  temporary.clear();
  return Error::success();
}

Error mlir::hpr::commitOutputs(ArrayRef<OutputFile *> outputs) {
  for (OutputFile *output : outputs)
    if (Error error = output->finish())
      return error; // the others are discarded by their destructors
  for (OutputFile *output : outputs)
    if (Error error = output->commit())
      return error;
  return Error::success();
}
