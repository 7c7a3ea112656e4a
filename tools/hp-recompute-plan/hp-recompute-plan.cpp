//===- hp-recompute-plan.cpp - Plan recomputation for a pipeline ---------===//
//
// import (model + schedule) -> hpr IR -> planning pipeline -> export.
// Exit codes: 0 success, 1 bad input or a plan that fails verification,
// 2 usage errors. Outputs follow the project's output-file policy
// (hpr/Support/OutputFile.h): checked before any work, regular files written
// to a temporary and renamed only when complete.
//
//===----------------------------------------------------------------------===//

#include "hpr/Analysis/Timeline.h"
#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Driver/Planner.h"
#include "hpr/InitAll.h"
#include "hpr/Model/ModelJson.h"
#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Support/InputFile.h"
#include "hpr/Support/OutputFile.h"
#include "hpr/Target/Diagnostics.h"
#include "hpr/Target/PlanImport.h"
#include "hpr/Target/PlanJson.h"
#include "hpr/Target/PlanSummary.h"
#include "hpr/Target/SummaryTable.h"
#include "hpr/Target/TimelineSvg.h"
#include "hpr/Target/TorchCsv.h"
#include "hpr/Target/TraceJson.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Support/Timing.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Compiler.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/WithColor.h"

#include <optional>

using namespace llvm;
namespace sched = ::mlir::hpr::sched;
namespace model = ::mlir::hpr::model;

namespace {
enum class EmitKind { Summary, Json, Mlir, Csv, TorchCsv, Trace, Svg };

cl::OptionCategory category("hp-recompute-plan options");

cl::opt<std::string> modelFile("model",
                               cl::desc("Model: .pt (TorchScript archive), .ir "
                                        "(TorchScript IR text) or .json graph"),
                               cl::value_desc("file"), cl::cat(category));
cl::opt<int> regionDepth("region-depth",
                         cl::desc("Module depth of a region (TorchScript)"),
                         cl::init(1), cl::cat(category));
cl::opt<std::string>
    inputShape("input-shape",
               cl::desc("Input shapes, e.g. 4x40x48 or 4x40,4x40"),
               cl::cat(category));
cl::opt<std::string> inputDtype("input-dtype", cl::desc("Input dtype"),
                                cl::init("float32"), cl::cat(category));
cl::opt<bool> profile("profile", cl::desc("Measure each region's forward time"),
                      cl::cat(category));
cl::opt<std::string>
    stageSpec("stages",
              cl::desc("Explicit stage split: region index ranges, e.g. "
                       "0:0-3,1:4-7, or module paths per stage, e.g. "
                       "0:embed,layers.0;1:layers.1,norm (default: "
                       "balanced)"),
              cl::cat(category));

using mlir::hpr::CheckpointPolicy;
cl::opt<CheckpointPolicy> checkpointPolicy(
    "checkpoint", cl::desc("Which regions to checkpoint"),
    cl::values(clEnumValN(CheckpointPolicy::All, "all",
                          "every checkpointable region (one per block)"),
               clEnumValN(CheckpointPolicy::Model, "model",
                          "the regions the model file marks checkpoint"),
               clEnumValN(CheckpointPolicy::None, "none",
                          "no region: keep every activation (the baseline)"),
               clEnumValN(CheckpointPolicy::Auto, "auto",
                          "the fastest choice within --memory-budget"),
               clEnumValN(CheckpointPolicy::Selective, "selective",
                          "every checkpointable region, by the selective "
                          "policy (needs measured selective costs)")),
    cl::init(CheckpointPolicy::All), cl::cat(category));

cl::opt<std::string> scheduleFile("schedule",
                                  cl::desc("Schedule: .csv or .json"),
                                  cl::value_desc("file"), cl::cat(category));
cl::opt<std::string> scheduleGen(
    "schedule-gen",
    cl::desc("Built-in schedule: gpipe, 1f1b, interleaved-1f1b, zb-h1, "
             "interleaved-zb, zbv, dualpipev; or auto, the fastest of all but "
             "gpipe within --memory-budget"),
    cl::cat(category));
cl::opt<int64_t> ranks("ranks", cl::desc("Ranks of a generated schedule"),
                       cl::init(4), cl::cat(category));
cl::opt<int64_t> microbatches("microbatches",
                              cl::desc("Microbatches of a generated schedule"),
                              cl::init(8), cl::cat(category));
cl::opt<int64_t> stagesPerRank("stages-per-rank",
                               cl::desc("Stages per rank (default: the "
                                        "schedule's own)"),
                               cl::cat(category));
cl::opt<sched::CsvDialect>
    csvDialect("schedule-dialect", cl::desc("Action spelling of CSV schedules"),
               cl::values(clEnumValN(sched::CsvDialect::Current, "current",
                                     "F I W B (PyTorch since late 2024)"),
                          clEnumValN(sched::CsvDialect::Legacy, "legacy",
                                     "F B W BW (older PyTorch, sail-sg)")),
               cl::init(sched::CsvDialect::Current), cl::cat(category));

cl::opt<std::string> prefetch("prefetch",
                              cl::desc("Recompute placement: jit, "
                                       "lookahead=K or bubble"),
                              cl::init("jit"), cl::cat(category));
cl::opt<std::string> memoryBudget(
    "memory-budget",
    cl::desc(
        "Per-rank activation budget: bytes (suffixes KiB MiB GiB TiB "
        "KB MB GB TB B), or a multiple such as 1.5x of the checkpoint-all peak "
        "(the most any rank needs with every checkpointable region "
        "checkpointed, replayed jit): what --checkpoint auto and "
        "--prefetch bubble fit within; otherwise a check"),
    cl::cat(category));

cl::opt<int64_t> dpShard(
    "dp-shard",
    cl::desc("FSDP: ranks each stage's parameters are sharded over; plans "
             "unshard/reshard around their users (default 1, or the model "
             "JSON's data_parallel.shard)"),
    cl::cat(category));
cl::opt<int64_t> dpReplicate(
    "dp-replicate",
    cl::desc("HSDP: replicas of each shard group (default 1, or the model "
             "JSON's data_parallel.replicate)"),
    cl::cat(category));

cl::opt<EmitKind>
    emit("emit", cl::desc("Output format"),
         cl::values(clEnumValN(EmitKind::Summary, "summary", "per-rank table"),
                    clEnumValN(EmitKind::Json, "json", "plan JSON (version 2)"),
                    clEnumValN(EmitKind::Mlir, "mlir", "planned hpr IR"),
                    clEnumValN(EmitKind::Csv, "csv",
                               "schedule CSV with RECOMPUTE/CLEAR"),
                    clEnumValN(EmitKind::TorchCsv, "torch-csv",
                               "torch.distributed.pipelining CSV (-o "
                               "FILE.csv) and its FILE.hpr.json sidecar"),
                    clEnumValN(EmitKind::Trace, "trace",
                               "simulated timeline (Chrome trace JSON)"),
                    clEnumValN(EmitKind::Svg, "svg",
                               "simulated timeline and memory (SVG picture)")),
         cl::init(EmitKind::Summary), cl::cat(category));
cl::opt<std::string> outputFile("o", cl::desc("Output file (default: stdout)"),
                                cl::value_desc("file"), cl::init("-"),
                                cl::cat(category));
cl::opt<bool> printSummary("summary",
                           cl::desc("Also print the per-rank summary table"),
                           cl::cat(category));

cl::opt<std::string> verifyPlanFile(
    "verify",
    cl::desc("Check a finished plan JSON against the runtime contract "
             "(docs/runner.md) and exit: 0 admitted, 1 refused"),
    cl::value_desc("plan.json"), cl::cat(category));

/// The bundled default model (examples/gpt/gpt.model.json), compiled in.
const char *const kDefaultModelJson =
#include "DefaultModel.inc"
    ;
} // namespace

/// Reports `error`; returns exit code 2 for a usage error, else 1.
static int fail(Error error) {
  int code = error.isA<mlir::hpr::UsageError>() ? 2 : 1;
  handleAllErrors(std::move(error), [](const ErrorInfoBase &info) {
    WithColor::error(errs(), "hp-recompute-plan") << info.message() << "\n";
  });
  return code;
}

static int usageError(const Twine &message) {
  WithColor::error(errs(), "hp-recompute-plan") << message << "\n";
  return 2;
}

/// The exporter's OUT.json beside a TorchScript `--model OUT.pt` (or .ir),
/// which the importer reads too; "" for other models.
static std::string torchScriptSidecarPath() {
  StringRef model = modelFile;
  if (!model.ends_with(".pt") && !model.ends_with(".ir"))
    return "";
  SmallString<256> path(model);
  sys::path::replace_extension(path, ".json");
  return std::string(path);
}

/// An option as the command line spells it: -o, --model.
static std::string spelling(const cl::Option &option) {
  return (option.ArgStr.size() == 1 ? "-" : "--") + option.ArgStr.str();
}

/// Opens every output of the run before any work: -o, the torch-csv
/// sidecar and, when --summary prints to stdout beside a file, stdout.
/// Refuses an output that is an input or another output (exit code 2).
static Expected<std::vector<std::unique_ptr<mlir::hpr::OutputFile>>>
openOutputs() {
  using mlir::hpr::OutputFile;
  std::vector<std::unique_ptr<OutputFile>> outputs;
  auto add = [&](StringRef flag, StringRef path) -> Error {
    auto output = OutputFile::open(flag, path);
    if (!output)
      return output.takeError();
    for (const auto &earlier : outputs)
      if (Error error = (*output)->refuseSameAs(*earlier))
        return error;
    outputs.push_back(std::move(*output));
    return Error::success();
  };
  if (Error error = add("-o", outputFile))
    return error;
  // Messages name the file -o gave, then the sidecar's: "-o p.csv's sidecar
  // p.hpr.json".
  std::string sidecarFlag = "-o " + outputFile + "'s sidecar";
  if (emit == EmitKind::TorchCsv)
    if (Error error =
            add(sidecarFlag, mlir::hpr::torchCsvSidecarPath(outputFile)))
      return error;
  std::pair<StringRef, std::string> inputs[] = {
      {"--model", modelFile},
      {"the sidecar of --model", torchScriptSidecarPath()},
      {"--schedule", scheduleFile}};
  for (const auto &output : outputs)
    for (const auto &[flag, path] : inputs)
      if (!path.empty())
        if (Error error = output->refuseInput(flag, path))
          return error;
  if (printSummary && emit != EmitKind::Summary && outputFile != "-")
    if (Error error = add("--summary", "-"))
      return error;
  return outputs;
}

/// `--verify PLAN`: reads a plan JSON back into IR and runs the admission
/// check every runtime runs (verifyPlan).
static int verifyPlanMain() {
  auto buffer = mlir::hpr::readInputFile(verifyPlanFile, "plan");
  if (!buffer)
    return fail(buffer.takeError());
  mlir::DialectRegistry registry;
  mlir::hpr::registerAllDialects(registry);
  mlir::MLIRContext context(registry);
  context.printOpOnDiagnostic(false);
  mlir::ScopedDiagnosticHandler diagnostics(
      &context, [](mlir::Diagnostic &diag) {
        mlir::hpr::printDiagnostic(diag, errs(), "hp-recompute-plan");
        return mlir::success();
      });
  auto module = mlir::hpr::importPlanJson(context, (*buffer)->getBuffer(),
                                          verifyPlanFile);
  if (!module)
    return fail(module.takeError());
  if (mlir::failed(mlir::hpr::verifyImportedPlan(**module)))
    return 1;
  outs() << verifyPlanFile << ": admitted\n";
  return 0;
}

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  // `--mlir-timing` reports where the time goes, phase by phase.
  mlir::registerDefaultTimingManagerCLOptions();
  cl::HideUnrelatedOptions(category);
  cl::SetVersionPrinter([](raw_ostream &os) {
    os << "hp-recompute-plan (hp-recompute " HPR_VERSION "), LLVM/MLIR "
       << LLVM_VERSION_STRING << "\n";
  });
  std::string parseErrors;
  raw_string_ostream parseErrorStream(parseErrors);
  if (!cl::ParseCommandLineOptions(
          argc, argv,
          "hp-recompute-plan: plan activation recomputation for a pipeline "
          "schedule\n\nWith no arguments, plans the bundled GPT example on a "
          "4-rank ZBV schedule with 8 microbatches.\n",
          &parseErrorStream)) {
    errs() << parseErrors;
    return 2;
  }
  // A flag given an empty value would read as left out: refused (-o "" is
  // refused by the output-file policy).
  for (cl::opt<std::string> *option :
       {&modelFile, &scheduleFile, &scheduleGen, &memoryBudget, &inputShape,
        &inputDtype, &stageSpec, &prefetch, &verifyPlanFile})
    if (option->getNumOccurrences() && option->empty())
      return usageError(spelling(*option) +
                        ": expected a value, got an empty string");
  if (verifyPlanFile.getNumOccurrences()) {
    for (const auto &entry : cl::getRegisteredOptions())
      if (entry.second != &verifyPlanFile &&
          entry.second->getNumOccurrences() &&
          llvm::is_contained(entry.second->Categories, &category))
        return usageError("--verify checks a finished plan and takes no "
                          "other option; " +
                          spelling(*entry.second) + " is given");
    return verifyPlanMain();
  }
  std::optional<mlir::hpr::MemoryBudget> budget;
  if (!memoryBudget.empty() &&
      !(budget = mlir::hpr::parseMemoryBudget(memoryBudget)))
    return usageError("--memory-budget: " + mlir::hpr::kMemoryBudgetExpected +
                      ", got '" + memoryBudget + "'");

  // The request as given: an option left out stays unset, and the request's
  // rules (PlanRequest::validate) tell a default from a choice.
  mlir::hpr::PlanRequest request;
  request.modelFile = modelFile;
  request.scheduleFile = scheduleFile;
  request.scheduleGen = scheduleGen;
  // The bundled default: ZBV, 4 ranks, 8 microbatches, and with no --model
  // the GPT example.
  if (scheduleFile.empty() && scheduleGen.empty()) {
    request.scheduleGen = "zbv";
    if (modelFile.empty()) {
      request.modelJsonText = kDefaultModelJson;
      request.modelJsonName = "<bundled gpt example>";
    }
  }
  auto ifGiven = [](const auto &option) {
    using Value = std::decay_t<decltype(option.getValue())>;
    return option.getNumOccurrences() ? std::optional<Value>(option.getValue())
                                      : std::nullopt;
  };
  request.regionDepth = ifGiven(regionDepth);
  request.inputShape = inputShape;
  request.inputDtype = ifGiven(inputDtype);
  request.profile = ifGiven(profile);
  request.stageSpec = stageSpec;
  request.checkpoint = ifGiven(checkpointPolicy);
  request.ranks = ifGiven(ranks);
  request.microbatches = ifGiven(microbatches);
  request.stagesPerRank = ifGiven(stagesPerRank);
  request.csvDialect = csvDialect;
  request.prefetch = prefetch;
  request.budget = budget;
  request.dpShard = ifGiven(dpShard);
  request.dpReplicate = ifGiven(dpReplicate);
  request.lowerRuntime = emit == EmitKind::Json || emit == EmitKind::Mlir ||
                         emit == EmitKind::TorchCsv;
  if (Error error = request.validate())
    return fail(std::move(error));

  // Rules of the CLI's own options.
  bool csvSchedule = !scheduleFile.empty() &&
                     !StringRef(scheduleFile).ends_with_insensitive(".json");
  if (!csvSchedule && emit != EmitKind::Csv && csvDialect.getNumOccurrences())
    return usageError("--schedule-dialect spells CSV schedules: read with "
                      "--schedule FILE.csv or written with --emit csv");
  if (emit == EmitKind::TorchCsv &&
      (outputFile == "-" || !StringRef(outputFile).ends_with(".csv")))
    return usageError("--emit torch-csv writes two files, FILE.csv and its "
                      "sidecar FILE.hpr.json; give -o FILE.csv");
  for (const auto &entry : cl::getRegisteredOptions())
    if (entry.second->getNumOccurrences() > 1 &&
        llvm::is_contained(entry.second->Categories, &category))
      return usageError(spelling(*entry.second) + " is given " +
                        Twine(entry.second->getNumOccurrences()) +
                        " times; give it once");
  auto outputs = openOutputs();
  if (!outputs)
    return fail(outputs.takeError());

  mlir::DefaultTimingManager timing;
  mlir::applyDefaultTimingManagerCLOptions(timing);
  mlir::TimingScope rootTimer = timing.getRootScope();
  mlir::DialectRegistry registry;
  mlir::hpr::registerAllDialects(registry);
  mlir::MLIRContext context(registry);
  // Diagnostics name the action; the op's generic form would repeat it (or,
  // for the module, print the whole plan).
  context.printOpOnDiagnostic(false);
  bool diagnosed = false;
  mlir::ScopedDiagnosticHandler diagnostics(
      &context, [&](mlir::Diagnostic &diag) {
        diagnosed = true;
        mlir::hpr::printDiagnostic(diag, errs(), "hp-recompute-plan");
        return mlir::success();
      });
  std::vector<std::string> warnings;
  auto planned = mlir::hpr::runPlanner(context, request, rootTimer, &warnings);
  for (const std::string &warning : warnings)
    WithColor::warning(errs(), "hp-recompute-plan") << warning << "\n";
  if (!planned) {
    if (!diagnosed) // otherwise the passes have said what is wrong
      return fail(planned.takeError());
    consumeError(planned.takeError());
    return 1;
  }
  mlir::ModuleOp module = *planned->module;
  const mlir::hpr::PlanSummary *summary = &planned->summary;
  mlir::hpr::ScheduleOp scheduleOp = mlir::hpr::getSchedule(module);

  mlir::TimingScope exportTimer = rootTimer.nest("export");
  auto write = [&](raw_ostream &os) -> Error {
    switch (emit) {
    case EmitKind::Summary:
      if (!planned->options.scheduleCandidates.empty())
        mlir::hpr::printScheduleCandidates(planned->options.scheduleCandidates,
                                           scheduleOp.getName(), os);
      os << "plan: model '" << mlir::hpr::getModel(module).getName()
         << "', schedule '" << scheduleOp.getName() << "' ("
         << scheduleOp.getNumRanks() << " ranks, " << scheduleOp.getNumStages()
         << " stages, " << scheduleOp.getNumMicrobatches()
         << " microbatches), prefetch " << prefetch << ", checkpoint "
         << planned->options.checkpoint << "\n";
      mlir::hpr::printSummaryTable(*summary, os);
      break;
    case EmitKind::Json:
      mlir::hpr::writePlanJson(module, *summary, planned->options, os);
      break;
    case EmitKind::Mlir:
      module->print(os);
      break;
    case EmitKind::Csv:
      os << sched::printScheduleCsv(mlir::hpr::extractSchedule(module).schedule,
                                    csvDialect);
      break;
    case EmitKind::Trace:
      mlir::hpr::writeTraceJson(*summary, os);
      break;
    case EmitKind::Svg:
      mlir::hpr::writeTimelineSvg(module, *summary, os);
      break;
    case EmitKind::TorchCsv:
      llvm_unreachable("two files, written below");
    }
    return Error::success();
  };
  mlir::hpr::OutputFile &output = *outputs->front();
  if (emit == EmitKind::TorchCsv)
    mlir::hpr::writeTorchCsv(module, sys::path::filename(outputFile),
                             output.os(), (*outputs)[1]->os());
  else if (Error error = write(output.os()))
    return fail(std::move(error));
  if (printSummary && emit != EmitKind::Summary)
    mlir::hpr::printSummaryTable(
        *summary, outputFile == "-" ? errs() : outputs->back()->os());
  // Renamed only when every output was written (hpr.output.atomic-replace).
  SmallVector<mlir::hpr::OutputFile *> all;
  for (const auto &file : *outputs)
    all.push_back(file.get());
  if (Error error = mlir::hpr::commitOutputs(all))
    return fail(std::move(error));
  exportTimer.stop();
  // Like clang's -disable-free: tearing down a million ops one by one costs
  // a tenth of the run and frees nothing the process keeps.
  // Under ASan the module is freed, so LeakSanitizer checks everything else.
  if (!LLVM_ADDRESS_SANITIZER_BUILD)
    (void)planned->module.release();
  return 0;
}
