//===- ModelFile.cpp - Read a model file of any supported format ----------===//

#include "hpr/Model/ModelFile.h"
#include "hpr/Model/ExportedProgramImport.h"
#include "hpr/Model/ModelJson.h"
#include "hpr/Support/InputFile.h"

#include "llvm/Support/DynamicLibrary.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Signals.h"
#include "llvm/Support/raw_ostream.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace mlir::hpr::model;

/// The entry point libHPRTorchScript.so exports (TorchScriptEntry.cpp).
using ImportTorchScriptFn = bool (*)(const char *path,
                                     const TorchScriptOptions *options,
                                     std::vector<std::string> *warnings,
                                     ModelGraph *graph, std::string *error);

/// Where libHPRTorchScript.so is: $HPR_TORCHSCRIPT_LIBRARY, else `lib/`
/// beside the tool's `bin/` folder (build tree and installed package alike).
static std::string torchScriptLibrary() {
  if (const char *override = std::getenv("HPR_TORCHSCRIPT_LIBRARY"))
    return override;
  std::string tool = llvm::sys::fs::getMainExecutable(
      nullptr, reinterpret_cast<void *>(&torchScriptLibrary));
  llvm::SmallString<256> library(
      llvm::sys::path::parent_path(llvm::sys::path::parent_path(tool)));
  llvm::sys::path::append(library, "lib", HPR_TORCHSCRIPT_LIBRARY_NAME);
  return std::string(library);
}

// LibTorch at run time. The importer is compiled against LibTorch but linked
// against none of it (lib/Model/CMakeLists.txt): it names no libtorch_cpu.so
// or libc10.so, libraries outside every manylinux policy, so the wheel passes
// auditwheel. Its loader makes the LibTorch it was built with global first:
// the torch package installed beside hp_recompute (site-packages/torch/lib,
// two folders up from the importer), else the one the build linked
// (HPR_LIBTORCH_CPU). libtorch_cpu.so brings libc10.so, its own dependency.
static llvm::Error loadLibTorch(llvm::StringRef importer) {
  llvm::SmallString<256> installed(llvm::sys::path::parent_path(
      llvm::sys::path::parent_path(llvm::sys::path::parent_path(importer))));
  llvm::sys::path::append(installed, "torch", "lib",
                          llvm::sys::path::filename(HPR_LIBTORCH_CPU));
  std::string errors;
  for (llvm::StringRef candidate :
       {llvm::StringRef(installed), llvm::StringRef(HPR_LIBTORCH_CPU)}) {
    if (!llvm::sys::fs::exists(candidate))
      continue;
    std::string loadError;
    if (llvm::sys::DynamicLibrary::getPermanentLibrary(candidate.str().c_str(),
                                                       &loadError)
            .isValid())
      return llvm::Error::success();
    errors += "; " + loadError;
  }
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      llvm::Twine("it needs the LibTorch of torch (the torch package), found "
                  "neither at ") +
          installed + " nor at " + HPR_LIBTORCH_CPU + errors +
          ": install the torch version hp-recompute was built with");
}

/// Imports through libHPRTorchScript.so, loaded on first use: LibTorch takes
/// about 0.4 s to load, which planning from a JSON model or from a schedule
/// alone should not pay. Loaded with every symbol bound (RTLD_NOW), so that a
/// LibTorch of another version fails here, naming the symbol it lacks.
static llvm::Expected<ModelGraph>
importTorchScriptOnDemand(llvm::StringRef path,
                          const TorchScriptOptions &options,
                          std::vector<std::string> *warnings) {
  std::string library = torchScriptLibrary();
  auto fail = [&](const llvm::Twine &why) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   path +
                                       ": cannot load the TorchScript "
                                       "importer " +
                                       library + ": " + why);
  };
  if (llvm::Error err = loadLibTorch(library))
    return fail(llvm::toString(std::move(err)));
  void *handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    return fail(::dlerror());
  void *symbol = ::dlsym(handle, "hprImportTorchScript");
  if (!symbol)
    return fail("no hprImportTorchScript symbol");
  auto importFn = reinterpret_cast<ImportTorchScriptFn>(symbol);
  ModelGraph graph;
  std::string error;
  if (!importFn(path.str().c_str(), &options, warnings, &graph, &error))
    return llvm::createStringError(llvm::inconvertibleErrorCode(), error);
  return graph;
}

static bool writeAll(int fd, const std::string &text) {
  for (size_t done = 0; done < text.size();) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    done += n;
  }
  return true;
}

/// LibTorch's archive and IR parsers are not hardened against corrupt input:
/// torch::jit::load of a damaged `.pt` can crash the process (found by
/// hpr-fuzz-torchscript-pt on Debian's torch 1.13). So the import runs in a
/// child process, which sends the graph back as model JSON (printModelJson;
/// parseModelJson reads it back to an equal graph) with its warnings; a child
/// that dies becomes an error naming the file and the signal.
static llvm::Expected<ModelGraph>
importTorchScriptIsolated(llvm::StringRef path,
                          const TorchScriptOptions &options,
                          std::vector<std::string> *warnings) {
  auto fail = [&](const llvm::Twine &what) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   path + ": " + what);
  };
  int fds[2];
  if (::pipe(fds) != 0)
    return fail(llvm::Twine("cannot start the importer: ") +
                std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return fail(llvm::Twine("cannot start the importer: ") +
                std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    // A crash here is reported by the parent; the tool's crash handler (stack
    // dump, "PLEASE submit a bug report") would only add noise.
    llvm::sys::unregisterHandlers();
    std::vector<std::string> childWarnings;
    nlohmann::json reply;
    llvm::Expected<ModelGraph> graph =
        importTorchScriptOnDemand(path, options, &childWarnings);
    if (graph)
      reply = {{"model", printModelJson(*graph)}, {"warnings", childWarnings}};
    else
      reply = {{"error", llvm::toString(graph.takeError())}};
    bool sent =
        writeAll(fds[1], reply.dump(-1, ' ', false,
                                    nlohmann::json::error_handler_t::replace));
    ::_exit(sent ? 0 : 1); // no atexit handlers: they belong to the parent
  }
  ::close(fds[1]);
  std::string text;
  char chunk[1 << 16];
  for (;;) {
    ssize_t n = ::read(fds[0], chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    text.append(chunk, n);
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  nlohmann::json reply =
      nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  bool answered =
      reply.is_object() && (reply.contains("error") || reply.contains("model"));
  if (!answered) {
    // Killed by a signal, or (under ASan, which catches the signal) exited
    // without a reply.
    std::string how =
        WIFSIGNALED(status)
            ? "signal " + std::to_string(WTERMSIG(status)) + ", " +
                  strsignal(WTERMSIG(status))
            : "exit status " + std::to_string(WEXITSTATUS(status));
    return fail("LibTorch crashed reading this file (" + how +
                "): it is damaged or not a TorchScript " +
                (path.ends_with(".pt") ? "archive" : "IR text"));
  }
  if (reply.contains("error"))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   reply["error"].get<std::string>());
  for (const auto &warning : reply["warnings"])
    if (warnings)
      warnings->push_back(warning.get<std::string>());
  return parseModelJson(reply["model"].get<std::string>(), path);
}

llvm::Expected<ModelGraph>
mlir::hpr::model::readModelFile(llvm::StringRef path,
                                const TorchScriptOptions &options,
                                std::vector<std::string> *warnings) {
  if (path.ends_with(".pt") || path.ends_with(".ir"))
    return importTorchScriptIsolated(path, options, warnings);
  if (path.ends_with(".pt2")) {
    if (options.profile)
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          "%s: --profile needs a TorchScript model (.pt or .ir): the .pt2 "
          "importer reads no weights and runs nothing",
          path.str().c_str());
    std::vector<std::string> localWarnings;
    auto graph = importExportedProgram(path, options.regionDepth,
                                       warnings ? *warnings : localWarnings);
    for (const std::string &w : localWarnings)
      llvm::errs() << w << "\n";
    return graph;
  }
  if (path.ends_with(".json")) {
    auto buffer = mlir::hpr::readInputFile(path);
    if (!buffer)
      return buffer.takeError();
    return parseModelJson((*buffer)->getBuffer(), path);
  }
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      "%s: unknown model format; expected a file ending in .pt2 (torch.export "
      "archive), .pt (TorchScript archive), .ir (TorchScript IR text) or "
      ".json (model JSON graph)",
      path.str().c_str());
}
