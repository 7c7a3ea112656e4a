//===- PlannerModule.cpp - hp_recompute._planner: the planner in process -===//
//
// The Python extension through which Python reaches the C++ planner instead
// of restating its rules: `plan` runs the planner (mlir::hpr::runPlanner, the
// CLI's code) and returns the plan JSON; `verify_plan` reads a plan back into
// IR and runs the admission check (mlir::hpr::verifyImportedPlan), the same
// code as `hp-recompute-plan --verify`. Diagnostics come back as the lines
// the CLI prints, so every runtime names a broken rule in the same words.
// `read_torch_csv` reads a torch CSV and its sidecar back as plan JSON with
// the reader that sits beside their writer (mlir::hpr::readTorchCsv), and
// locates plan JSON paths at the pair's cells and entries.
// The cost rules are reached here too: `op_kind`, `is_view_op` and
// `op_flops` are the importers' op table (hpr/Model/OpCosts.h) for the
// exporter, `segment_ops` their region rules (hpr/Model/Segments.h),
// `region_time_field` the rule that sums an action's time from its regions
// (mlir::hpr::regionTimeOf) for `hp_recompute.costs --from-run`.
//
//===----------------------------------------------------------------------===//

#include "hpr/Analysis/CostModel.h"
#include "hpr/Driver/Planner.h"
#include "hpr/InitAll.h"
#include "hpr/Model/OpCosts.h"
#include "hpr/Model/Segments.h"
#include "hpr/Model/TorchScriptImport.h"
#include "hpr/Schedule/ScheduleUtils.h"
#include "hpr/Support/OutputFile.h"
#include "hpr/Target/Diagnostics.h"
#include "hpr/Target/PlanImport.h"
#include "hpr/Target/TorchCsv.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/MLIRContext.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;
using namespace nb::literals;

namespace {
/// A context whose diagnostics are collected as the CLI prints them.
struct CollectingContext {
  static mlir::DialectRegistry registry() {
    mlir::DialectRegistry registry;
    mlir::hpr::registerAllDialects(registry);
    return registry;
  }

  CollectingContext()
      : context(registry()), handler(&context, [this](mlir::Diagnostic &diag) {
          std::string line;
          llvm::raw_string_ostream os(line);
          mlir::hpr::printDiagnostic(diag, os, "hp_recompute");
          problems.push_back(llvm::StringRef(line).rtrim().str());
          return mlir::success();
        }) {
    context.printOpOnDiagnostic(false);
  }

  mlir::MLIRContext context;
  mlir::ScopedDiagnosticHandler handler;
  std::vector<std::string> problems;
};
} // namespace

/// Every problem found in plan `text`, one line each (empty: admitted).
static std::vector<std::string> verifyPlanText(const std::string &text,
                                               const std::string &name) {
  CollectingContext collecting;
  auto module = mlir::hpr::importPlanJson(collecting.context, text, name);
  if (!module) {
    collecting.problems.push_back(llvm::toString(module.takeError()));
    return collecting.problems;
  }
  if (mlir::failed(mlir::hpr::verifyImportedPlan(**module)) &&
      collecting.problems.empty())
    collecting.problems.push_back(name + ": the plan failed verification");
  return collecting.problems;
}

/// What planning a request gives Python: the plan JSON, or the problems that
/// stopped it (each a line as the CLI prints it, a usage error starting with
/// "usage: "); and the warnings the CLI prints as `warning: ` lines.
using PlanResult =
    std::tuple<std::string, std::vector<std::string>, std::vector<std::string>>;

/// The plan JSON of `request`, or the problems that stopped it, and the
/// planner's warnings.
static PlanResult planText(const mlir::hpr::PlanRequest &request) {
  CollectingContext collecting;
  mlir::TimingScope timing;
  std::vector<std::string> warnings;
  auto planned =
      mlir::hpr::runPlanner(collecting.context, request, timing, &warnings);
  if (!planned) {
    bool usage = planned.errorIsA<mlir::hpr::UsageError>();
    std::string message = llvm::toString(planned.takeError());
    if (collecting.problems.empty() || usage)
      collecting.problems.push_back((usage ? "usage: " : "") + message);
    return {"", collecting.problems, warnings};
  }
  std::string json;
  llvm::raw_string_ostream os(json);
  mlir::hpr::writePlanJson(*planned->module, planned->summary, planned->options,
                           os);
  return {json, {}, warnings};
}

/// Raises ValueError with `message`; bytes that are not UTF-8 (a message may
/// quote an input) are replaced rather than failing the conversion.
[[noreturn]] static void raiseValueError(const std::string &message) {
  nb::object text = nb::steal(PyUnicode_DecodeUTF8(
      message.data(), static_cast<Py_ssize_t>(message.size()), "replace"));
  PyErr_SetObject(PyExc_ValueError, text.ptr());
  throw nb::python_error();
}

//===----------------------------------------------------------------------===//
// Op costs: Python values as the op table's facts
//===----------------------------------------------------------------------===//

/// A torch.Tensor (or anything with its shape, stride(), element_size() and
/// requires_grad), described without LibTorch.
static std::optional<mlir::hpr::model::TensorFacts>
tensorFacts(nb::handle value) {
  if (!nb::hasattr(value, "shape") || !nb::hasattr(value, "stride") ||
      !nb::hasattr(value, "element_size"))
    return std::nullopt;
  mlir::hpr::model::TensorFacts facts;
  for (nb::handle size : value.attr("shape"))
    facts.sizes.push_back(nb::cast<int64_t>(size));
  for (nb::handle stride : value.attr("stride")())
    facts.strides.push_back(nb::cast<int64_t>(stride));
  facts.elementSize = nb::cast<int64_t>(value.attr("element_size")());
  if (nb::hasattr(value, "requires_grad"))
    facts.requiresGrad = nb::cast<bool>(value.attr("requires_grad"));
  return facts;
}

/// One argument as the dispatcher passed it: a tensor, a list of tensors or
/// of ints, a bool, an int, a float; anything else is None to the rules.
static mlir::hpr::model::OpArg opArg(nb::handle value) {
  using Kind = mlir::hpr::model::OpArg::Kind;
  mlir::hpr::model::OpArg arg;
  if (value.is_none())
    return arg;
  if (nb::isinstance<nb::bool_>(value)) { // before int: a bool is an int
    arg.kind = Kind::Bool;
    arg.boolValue = nb::cast<bool>(value);
  } else if (nb::isinstance<nb::int_>(value)) {
    arg.kind = Kind::Int;
    arg.intValue = nb::cast<int64_t>(value);
  } else if (nb::isinstance<nb::float_>(value)) {
    arg.kind = Kind::Double;
    arg.doubleValue = nb::cast<double>(value);
  } else if (auto facts = tensorFacts(value)) {
    arg.kind = Kind::Tensor;
    arg.tensors.push_back(std::move(*facts));
  } else if (nb::isinstance<nb::list>(value) ||
             nb::isinstance<nb::tuple>(value)) {
    bool ints = true;
    for (nb::handle item : value) {
      if (nb::isinstance<nb::int_>(item) && !nb::isinstance<nb::bool_>(item))
        arg.ints.push_back(nb::cast<int64_t>(item));
      else
        ints = false;
      if (auto facts = tensorFacts(item))
        arg.tensors.push_back(std::move(*facts));
    }
    arg.kind = ints ? Kind::IntList : Kind::TensorList;
  }
  return arg;
}

/// The forward FLOPs of op `name` on `inputs` giving `outputs`, as the
/// importers price it; nullopt where the table has no rule.
static std::optional<double>
opFlopsOf(const std::string &name, nb::sequence inputs, nb::sequence outputs) {
  mlir::hpr::model::OpFacts op;
  op.kind = mlir::hpr::model::canonicalOpKind(name);
  for (nb::handle input : inputs)
    op.inputs.push_back(opArg(input));
  for (nb::handle output : outputs)
    op.outputs.push_back(opArg(output));
  return mlir::hpr::model::opFlops(op);
}

/// The segments of the ops the exporter observed: `ops` holds per op
/// (name, module call stack, the stack's modules whose call is not their
/// first); `regions`, when given, the module paths that are the regions.
/// Returns per op its segment index and per segment (name, checkpointable);
/// ValueError with the importers' message otherwise.
static std::pair<std::vector<size_t>,
                 std::vector<std::tuple<std::string, bool>>>
segmentOpsOf(const std::string &name, nb::sequence ops, int regionDepth,
             const std::vector<std::string> &regions) {
  std::vector<mlir::hpr::model::OpFacts> facts;
  for (nb::handle item : ops) {
    auto [opName, chain, repeated] =
        nb::cast<std::tuple<std::string, std::vector<std::string>,
                            std::vector<std::string>>>(item);
    mlir::hpr::model::OpFacts op;
    op.kind = mlir::hpr::model::canonicalOpKind(opName);
    op.where =
        name + ": op " + std::to_string(facts.size()) + " (" + opName + ")";
    op.chain = std::move(chain);
    op.repeatedCalls = std::move(repeated);
    facts.push_back(std::move(op));
  }
  auto segments =
      mlir::hpr::model::segmentOps(name, facts, regionDepth, regions);
  if (!segments)
    throw nb::value_error(llvm::toString(segments.takeError()).c_str());
  std::vector<size_t> segmentOf(facts.size());
  std::vector<std::tuple<std::string, bool>> described;
  for (auto [index, seg] : llvm::enumerate(*segments)) {
    for (size_t op : seg.ops)
      segmentOf[op] = index;
    described.emplace_back(seg.name, seg.checkpointable);
  }
  return {segmentOf, described};
}

NB_MODULE(_planner, m) {
  m.doc() = "hp-recompute's C++ planner, in process (docs/python-api.md).";
  m.def(
      "verify_plan",
      [](const std::string &text, const std::string &name) {
        nb::gil_scoped_release release;
        return verifyPlanText(text, name);
      },
      "text"_a, "name"_a,
      "Reads plan JSON `text` (named `name` in messages) back into the "
      "planner's IR and runs its admission check; returns the problems "
      "found, one line each, as `hp-recompute-plan --verify` prints them "
      "(an empty list: the plan is admitted).");
  nb::class_<mlir::hpr::TorchCsvPlan>(
      m, "TorchCsvPlan",
      "A torch CSV and its sidecar read back as plan JSON (read_torch_csv).")
      .def_ro("plan", &mlir::hpr::TorchCsvPlan::plan,
              "The plan JSON text (version 2, untagged; each receive posts "
              "itself where its RECV cell stands).")
      .def_ro("csv_path", &mlir::hpr::TorchCsvPlan::csvPath)
      .def_ro("sidecar_path", &mlir::hpr::TorchCsvPlan::sidecarPath)
      .def(
          "locate",
          [](const mlir::hpr::TorchCsvPlan &read, const std::string &path) {
            return read.locate(path);
          },
          "json_path"_a,
          "Where the user finds plan JSON path `json_path` "
          "(\"/ranks/1/actions/4/peer\"): the CSV cell of its action "
          "(\"plan.csv:2:5 ('3F0'): peer\"), or the sidecar entry "
          "(\"plan.hpr.json: /ranks/1/inserts/0\").");
  m.def(
      "read_torch_csv",
      [](const std::string &csvPath) {
        llvm::Expected<mlir::hpr::TorchCsvPlan> read = [&] {
          nb::gil_scoped_release release;
          CollectingContext collecting;
          return mlir::hpr::readTorchCsvFiles(collecting.context, csvPath);
        }();
        if (!read)
          raiseValueError(llvm::toString(read.takeError()));
        return std::move(*read);
      },
      "csv_path"_a,
      "Reads the torch CSV `csv_path` (hp-recompute-plan --emit torch-csv) "
      "and its sidecar (torch_csv_sidecar_path) as a TorchCsvPlan, with the "
      "planner's own reader; ValueError with a message located at the cell "
      "(FILE:ROW:COL) or the sidecar's JSON path otherwise. The plan is not "
      "admitted yet: verify_plan it, locating its problems with "
      "TorchCsvPlan.locate.");
  m.def(
      "torch_csv_sidecar_path",
      [](const std::string &csvPath) {
        return mlir::hpr::torchCsvSidecarPath(csvPath);
      },
      "csv_path"_a,
      "The sidecar beside torch CSV `csv_path`: \"plan.csv\" -> "
      "\"plan.hpr.json\".");
  m.def(
      "plan",
      [](std::optional<std::string> schedule, std::optional<std::string> gen,
         std::optional<std::string> model, std::optional<int64_t> ranks,
         std::optional<int64_t> microbatches,
         std::optional<int64_t> stagesPerRank,
         std::optional<std::string> checkpoint,
         std::optional<std::string> prefetch, std::optional<std::string> budget,
         std::optional<std::string> stages, std::optional<int64_t> dpShard,
         std::optional<int64_t> dpReplicate) {
        using mlir::hpr::OptionSpelling;
        mlir::hpr::PlanRequest request;
        request.spelling = OptionSpelling::Keyword;
        request.scheduleFile = schedule.value_or("");
        request.scheduleGen = gen.value_or("");
        request.modelFile = model.value_or("");
        request.ranks = ranks;
        request.microbatches = microbatches;
        request.stagesPerRank = stagesPerRank;
        // A keyword the CLI would refuse with exit 2, as the CLI words it.
        auto usage = [](llvm::StringRef option, llvm::StringRef expected,
                        const std::string &got) {
          return PlanResult{
              "",
              {"usage: " +
               mlir::hpr::optionName(option, OptionSpelling::Keyword) + ": " +
               expected.str() + ", got '" + got + "'"},
              {}};
        };
        if (checkpoint) {
          request.checkpoint = mlir::hpr::parseCheckpointPolicy(*checkpoint);
          if (!request.checkpoint)
            return usage("checkpoint",
                         "expected all, model, none, auto or selective",
                         *checkpoint);
        }
        if (prefetch)
          request.prefetch = *prefetch;
        if (budget) {
          request.budget = mlir::hpr::parseMemoryBudget(*budget);
          if (!request.budget)
            return usage("memory-budget", mlir::hpr::kMemoryBudgetExpected,
                         *budget);
        }
        request.stageSpec = stages.value_or("");
        request.dpShard = dpShard;
        request.dpReplicate = dpReplicate;
        nb::gil_scoped_release release;
        return planText(request);
      },
      "schedule"_a.none(), "schedule_gen"_a.none(), "model"_a.none(),
      "ranks"_a.none(), "microbatches"_a.none(), "stages_per_rank"_a.none(),
      "checkpoint"_a.none(), "prefetch"_a.none(), "memory_budget"_a.none(),
      "stages"_a.none(), "dp_shard"_a.none() = nb::none(),
      "dp_replicate"_a.none() = nb::none(),
      "Runs the planner as hp-recompute-plan does; None is an option not "
      "given. Returns (plan JSON text, []) or (\"\", the problems, one line "
      "each; a request the CLI would refuse with exit 2 starts with "
      "\"usage: \" and names options as keyword arguments: ranks=).");
  m.def(
      "op_kind",
      [](const std::string &name) {
        return mlir::hpr::model::canonicalOpKind(name);
      },
      "name"_a,
      "The name the planner's op table knows op `name` by, \"ns::op\": "
      "\"aten.mm.default\", \"aten.mm\", \"torch.ops.aten.mm.default\" and "
      "\"aten::mm\" are all \"aten::mm\"; a kernel is named by its op "
      "(\"aten._softmax.default\" -> \"aten::softmax\").");
  m.def(
      "is_view_op",
      [](const std::string &name) {
        return mlir::hpr::model::isViewOp(
            mlir::hpr::model::canonicalOpKind(name));
      },
      "name"_a,
      "Whether op `name` (any spelling op_kind accepts) only views its "
      "input: no FLOPs, and outside regions it opens none.");
  m.def("op_flops", &opFlopsOf, "name"_a, "inputs"_a, "outputs"_a,
        "Forward FLOPs of op `name` (any spelling op_kind accepts) called "
        "with `inputs` (the positional arguments: tensors, lists, scalars) "
        "and giving `outputs` (its result tensors in order), by the rules "
        "the .pt2 and TorchScript importers price it with; None when no rule "
        "covers the op (the importers warn and count 0).");
  m.def("segment_ops", &segmentOpsOf, "name"_a, "ops"_a, "region_depth"_a,
        "regions"_a = std::vector<std::string>(),
        "Forms the regions of an executed op list as the .pt2 and "
        "TorchScript importers do (docs/models.md, \"Region rules\"). "
        "`ops`: per op in program order (op name in any spelling op_kind "
        "accepts, its module call stack as module paths outermost first, "
        "the paths of that stack whose call is not the module's first); "
        "`regions`: the module paths to take for the regions instead of "
        "the depth rule. Returns (per op its segment index, per segment "
        "(name, checkpointable)); ValueError with the importers' message "
        "(`name` and the op located in it) for a region's module called "
        "more than once, no region at that depth, or a chosen region named "
        "twice, inside another or running no op.");
  m.def(
      "parse_shape_list",
      [](const std::string &text) {
        auto shapes = mlir::hpr::model::parseShapeList(text);
        if (!shapes)
          throw nb::value_error(llvm::toString(shapes.takeError()).c_str());
        return *shapes;
      },
      "text"_a,
      "Parses an --input-shape value as hp-recompute-plan does "
      "(\"4x40x48,4x40\" -> [[4, 40, 48], [4, 40]]); ValueError with the "
      "CLI's located message otherwise.");
  m.def(
      "parse_dtype_list",
      [](const std::string &text, size_t numInputs) {
        auto names = mlir::hpr::model::parseDtypeList(text, numInputs);
        if (!names)
          throw nb::value_error(llvm::toString(names.takeError()).c_str());
        return *names;
      },
      "text"_a, "num_inputs"_a,
      "Parses an --input-dtype value for `num_inputs` inputs as "
      "hp-recompute-plan does: one canonical torch dtype name per input "
      "(\"half\" -> \"float16\"); ValueError with the CLI's located "
      "message otherwise.");
  m.def(
      "neighbour_stage",
      [](const std::string &action, int stage) -> std::optional<int> {
        std::optional<mlir::hpr::sched::ActionKind> kind =
            mlir::hpr::sched::kindFromJsonName(action);
        if (!kind || !mlir::hpr::sched::isComm(*kind))
          return std::nullopt;
        mlir::hpr::sched::Action transfer;
        transfer.kind = *kind;
        transfer.stage = stage;
        return mlir::hpr::sched::neighbourStage(transfer);
      },
      "action"_a, "stage"_a,
      "The stage a transfer `action` (\"send_f\", \"recv_f\", \"send_b\", "
      "\"recv_b\") of stage `stage` exchanges with (stage + 1 for send_f "
      "and recv_b, stage - 1 for the others; it may lie outside the "
      "schedule); None for any other action.");
  m.def(
      "region_time_field",
      [](const std::string &action, int stage, bool checkpointedForward,
         const std::string &regionCheckpoint) -> std::optional<std::string> {
        std::optional<mlir::hpr::sched::ActionKind> kind =
            mlir::hpr::sched::kindFromJsonName(action);
        std::optional<mlir::hpr::RegionCheckpoint> checkpoint =
            mlir::hpr::parseRegionCheckpoint(regionCheckpoint);
        if (!checkpoint)
          throw nb::value_error(
              ("region_checkpoint: expected none, full or selective, got '" +
               regionCheckpoint + "'")
                  .c_str());
        if (!kind)
          return std::nullopt;
        std::optional<mlir::hpr::RegionTime> time = mlir::hpr::regionTimeOf(
            *kind, /*firstStage=*/stage == 0, checkpointedForward, *checkpoint);
        if (!time)
          return std::nullopt;
        return mlir::hpr::regionTimeKey(*time).str();
      },
      "action"_a, "stage"_a, "checkpointed_forward"_a, "region_checkpoint"_a,
      "The region field (e.g. \"bwd_input_time_us\") the planner adds into "
      "the time of an `action` (a plan JSON op name: \"forward\", "
      "\"backward_input\", ...) of stage `stage` for a region checkpointed "
      "as `region_checkpoint` (\"none\", \"full\", \"selective\"), a forward "
      "running under checkpoint when "
      "`checkpointed_forward`; None when the region adds nothing (the "
      "first stage's backward_input, a plain region's recompute, a "
      "transfer). The rule of computeStageCosts.");
}
