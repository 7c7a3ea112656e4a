//===- hp-recompute-opt.cpp - mlir-opt driver with the hpr dialect -------===//
//
// MlirOptMain does the work, on an input and an output this driver opens:
// the input is read with a bound on its size and on its nesting, the output
// under the project's output-file policy (hpr/Support/OutputFile.h), so a
// failed run leaves an existing -o file as it was. Exit codes: 0 success,
// 1 bad input or a failed pipeline, 2 usage errors.
//
//===----------------------------------------------------------------------===//

#include "hpr/InitAll.h"
#include "hpr/Support/InputFile.h"
#include "hpr/Support/OutputFile.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/WithColor.h"

using namespace llvm;

/// The deepest bracket nesting read. MLIR's parser, verifier and printer
/// recurse once per nested region, attribute or type, a few KiB of stack
/// each: 5000 nested modules overflow the 8 MiB stack. Real hpr IR nests a
/// handful of levels.
static constexpr unsigned kMaxNesting = 256;

/// Reports \p error as the tool's; returns 2 for a usage error, else 1.
static int fail(Error error) {
  int code = error.isA<mlir::hpr::UsageError>() ? 2 : 1;
  handleAllErrors(std::move(error), [](const ErrorInfoBase &info) {
    WithColor::error(errs(), "hp-recompute-opt") << info.message() << "\n";
  });
  return code;
}

/// Refuses text nested deeper than kMaxNesting, located at the first bracket
/// too many (bytecode, which MLIR reads without recursing, is let through).
/// Counts `(`, `[`, `{` and `<` outside string literals and
/// comments, the brackets around every nested construct of MLIR's syntax (an
/// over-count at worst, `->`, `<=` and `>=` aside, which are not brackets).
static Error checkNesting(StringRef text, StringRef name) {
  if (text.starts_with("ML\xefR"))
    return Error::success();
  unsigned depth = 0, line = 1;
  size_t lineStart = 0;
  for (size_t i = 0, e = text.size(); i < e; ++i) {
    char c = text[i];
    char next = i + 1 < e ? text[i + 1] : '\0';
    if (c == '\n') {
      ++line;
      lineStart = i + 1;
    } else if (c == '/' && next == '/') {
      i = std::min(text.find('\n', i), e) - 1;
    } else if (c == '"') {
      for (++i; i < e && text[i] != '"'; ++i)
        if (text[i] == '\\')
          ++i;
        else if (text[i] == '\n')
          break; // an unterminated string: the parser reports it
      if (i < e && text[i] == '\n')
        --i;
    } else if ((c == '-' && next == '>') ||
               ((c == '<' || c == '>') && next == '=')) {
      ++i; // `->`, `<=`, `>=`
    } else if (StringRef("([{<").contains(c)) {
      if (++depth > kMaxNesting)
        return createStringError(
            formatv("{0}:{1}:{2}: nested deeper than {3} levels (brackets "
                    "and regions); the parser would run out of stack",
                    name, line, i - lineStart + 1, kMaxNesting)
                .str());
    } else if (StringRef(")]}>").contains(c) && depth > 0) {
      --depth;
    }
  }
  return Error::success();
}

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  mlir::DialectRegistry registry;
  registry.insert<mlir::func::FuncDialect>();
  mlir::hpr::registerAllDialects(registry);
  mlir::hpr::registerAllPasses();
  auto [inputName, outputName] = mlir::registerAndParseCLIOptions(
      argc, argv, "hp-recompute optimizer driver\n", registry);
  mlir::MlirOptMainConfig config =
      mlir::MlirOptMainConfig::createFromCLOptions();
  if (config.shouldShowDialects()) {
    outs() << "Available Dialects: ";
    interleaveComma(registry.getDialectNames(), outs());
    outs() << "\n";
    return 0;
  }
  if (inputName.empty())
    return fail(make_error<mlir::hpr::UsageError>(
        "<input file>: expected a file name, or - for standard input; got an "
        "empty string"));
  auto output = mlir::hpr::OutputFile::open("-o", outputName);
  if (!output)
    return fail(output.takeError());
  if (Error error = (*output)->refuseInput("input", inputName))
    return fail(std::move(error));
  auto input = mlir::hpr::readInputFile(inputName);
  if (!input)
    return fail(input.takeError());
  if (Error error = checkNesting((*input)->getBuffer(),
                                 inputName == "-" ? "<stdin>" : inputName))
    return fail(std::move(error));
  if (mlir::failed(mlir::MlirOptMain((*output)->os(), std::move(*input),
                                     registry, config)))
    return 1; // diagnosed; the output is discarded
  if (Error error = mlir::hpr::commitOutputs({output->get()}))
    return fail(std::move(error));
  return 0;
}
