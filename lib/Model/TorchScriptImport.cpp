//===- TorchScriptImport.cpp - Import TorchScript models ------------------===//
//
// Loads a `.pt` archive (torch::jit::load) or `.ir` text (torch::jit::parseIR),
// runs the forward graph once, op by op, on CPU with dummy inputs of the given
// shapes (this is the shape propagation: every op's real output shape, dtype
// and storage aliasing), records each op with the module call stack it ran
// in, then describes each op by its tensors' facts (shapes, strides, storage)
// for the region split and cost rules of RegionCosts.cpp. See docs/models.md.
//
//===----------------------------------------------------------------------===//

#include "RegionCosts.h"

#include "hpr/Model/TorchScriptImport.h"
#include "hpr/Support/Error.h"
#include "hpr/Support/InputFile.h"
#include "hpr/Support/ZipArchive.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <nlohmann/json.hpp>

#include <caffe2/serialize/versions.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/frontend/error_report.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

using namespace mlir::hpr::model;
using mlir::hpr::makeError;
using namespace mlir::hpr::model::detail;
namespace jit = torch::jit;

namespace {

/// One executed op (never prim::*) with the values it saw.
struct OpRecord {
  std::string kind;               ///< e.g. "aten::linear"
  std::string where;              ///< FILE:ROW:COL for messages
  std::vector<std::string> chain; ///< module call stack, outermost first
  jit::Node *node = nullptr;
  std::vector<c10::IValue> inputs;
  std::vector<c10::IValue> outputs;
};

/// Storages of parameters and buffers (excluded from saved/input bytes).
class ParamSet {
public:
  void add(const at::Tensor &t) {
    if (t.defined() && t.has_storage())
      storages.insert(storageKey(t));
  }
  static uint64_t storageKey(const at::Tensor &t) {
    return reinterpret_cast<uintptr_t>(t.storage().unsafeGetStorageImpl());
  }
  const std::set<uint64_t> &keys() const { return storages; }

private:
  std::set<uint64_t> storages;
};

TensorFacts factsOf(const at::Tensor &t) {
  TensorFacts facts;
  facts.sizes = t.sizes().vec();
  facts.strides = t.strides().vec();
  facts.elementSize = int64_t(t.element_size());
  facts.requiresGrad = t.requires_grad();
  if (t.has_storage()) {
    facts.storage = ParamSet::storageKey(t);
    facts.storageBytes = int64_t(t.storage().nbytes());
  }
  return facts;
}

/// An op argument as the cost rules see it; tensors nested in lists and
/// tuples are collected so that input bytes count them.
OpArg argOf(const c10::IValue &value) {
  OpArg arg;
  std::function<void(const c10::IValue &)> collect = [&](const c10::IValue &v) {
    if (v.isTensor() && v.toTensor().defined())
      arg.tensors.push_back(factsOf(v.toTensor()));
    else if (v.isList())
      for (const c10::IValue &item : v.toListRef())
        collect(item);
    else if (v.isTuple())
      for (const c10::IValue &item : v.toTupleRef().elements())
        collect(item);
  };
  if (value.isTensor()) {
    if (value.toTensor().defined())
      arg.kind = OpArg::Kind::Tensor;
  } else if (value.isTensorList()) {
    arg.kind = OpArg::Kind::TensorList;
  } else if (value.isIntList()) {
    arg.kind = OpArg::Kind::IntList;
    arg.ints = value.toIntVector();
  } else if (value.isBool()) {
    arg.kind = OpArg::Kind::Bool;
    arg.boolValue = value.toBool();
  } else if (value.isInt()) {
    arg.kind = OpArg::Kind::Int;
    arg.intValue = value.toInt();
  } else if (value.isDouble()) {
    arg.kind = OpArg::Kind::Double;
    arg.doubleValue = value.toDouble();
  }
  collect(value);
  return arg;
}

OpFacts factsOf(const OpRecord &record) {
  OpFacts op;
  op.kind = canonicalOpKind(record.kind);
  op.where = record.where;
  op.chain = record.chain;
  for (const c10::IValue &in : record.inputs)
    op.inputs.push_back(argOf(in));
  for (const c10::IValue &out : record.outputs)
    op.outputs.push_back(argOf(out));
  return op;
}

/// The median forward time (us) of \p ops replayed with their recorded
/// inputs; the first of six runs warms caches and allocators and is dropped.
double timeRecords(const std::vector<OpRecord> &records,
                   llvm::ArrayRef<size_t> ops) {
  std::vector<double> times;
  for (int run = 0; run < 6; ++run) {
    auto start = std::chrono::steady_clock::now();
    for (size_t index : ops) {
      const OpRecord &op = records[index];
      torch::jit::Stack stack(op.inputs.begin(), op.inputs.end());
      op.node->getOperation()(stack);
    }
    auto end = std::chrono::steady_clock::now();
    if (run > 0)
      times.push_back(
          std::chrono::duration<double, std::micro>(end - start).count());
  }
  std::sort(times.begin(), times.end());
  return std::max(times[times.size() / 2], 1e-3);
}

/// First non-empty line of a (possibly multi-line) LibTorch message.
std::string firstLine(const std::string &text) {
  llvm::SmallVector<llvm::StringRef> lines;
  llvm::StringRef(text).split(lines, '\n', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef line : lines)
    if (!line.trim().empty())
      return line.trim().str();
  return text;
}

/// Says which LibTorch read a file it could not load, and what to do: a model
/// saved by a newer torch can use ops or a format this LibTorch lacks.
std::string newerTorchHint() {
  return llvm::formatv("; this planner's TorchScript importer is built "
                       "against LibTorch {0}: build it against the torch "
                       "that saved the model (CMake takes the venv's torch "
                       "wheel when there is one, docs/models.md)",
                       TORCH_VERSION)
      .str();
}

at::ScalarType dtypeOf(const std::string &name) {
  static const std::map<std::string, at::ScalarType> table = {
      {"float32", at::kFloat},     {"float16", at::kHalf},
      {"bfloat16", at::kBFloat16}, {"float64", at::kDouble},
      {"int64", at::kLong},        {"int32", at::kInt},
      {"int16", at::kShort},       {"int8", at::kChar},
      {"uint8", at::kByte},        {"bool", at::kBool}};
  return table.at(name);
}

/// A dummy tensor: N(0,1) floats (fixed seed), zeros for integers so that
/// they are valid indices.
at::Tensor dummyTensor(llvm::ArrayRef<int64_t> shape, at::ScalarType type) {
  std::vector<int64_t> sizes(shape.begin(), shape.end());
  if (at::isFloatingType(type))
    return torch::randn(sizes, torch::TensorOptions().dtype(at::kFloat))
        .to(type);
  return torch::zeros(sizes, torch::TensorOptions().dtype(type));
}

//===----------------------------------------------------------------------===//
// Zip pre-check: miniz (inside LibTorch) must never see a damaged archive.
//===----------------------------------------------------------------------===//

/// Also checks the archive's file format version (`<root>/.data/version` or
/// `<root>/version`) against the newest this LibTorch reads, so that a file
/// from a newer torch gets a message saying so.
llvm::Error checkZip(llvm::StringRef path, llvm::StringRef data) {
  auto archive = mlir::hpr::ZipArchive::open(data, (path + ":1:1").str(),
                                             "TorchScript archive");
  if (!archive)
    return makeError(llvm::toString(archive.takeError()) +
                     "; expected a file written by torch.jit.save");
  for (const std::string &name : archive->names()) {
    llvm::StringRef record = llvm::StringRef(name).split('/').second;
    if (record != "version" && record != ".data/version")
      continue;
    auto text = archive->read(name, /*maxBytes=*/64);
    if (!text)
      return text.takeError();
    uint64_t version = 0;
    if (llvm::StringRef(*text).trim().getAsInteger(10, version))
      return makeError(path + ":1:1: the archive's '" + name +
                       "' is not a file format version number");
    if (version > caffe2::serialize::kMaxSupportedFileFormatVersion)
      return makeError(
          llvm::formatv("{0}:1:1: TorchScript file format version {1} is "
                        "newer than this LibTorch reads (at most {2})",
                        path, version,
                        caffe2::serialize::kMaxSupportedFileFormatVersion)
              .str() +
          newerTorchHint());
  }
  return llvm::Error::success();
}

//===----------------------------------------------------------------------===//
// Interpreter: runs a graph op by op and records every op.
//===----------------------------------------------------------------------===//

class Runner {
public:
  Runner(std::vector<OpRecord> &records, std::string file)
      : records(records), file(std::move(file)) {}

  /// Node -> module call stack for `.ir` graphs (from `scope:` comments).
  std::unordered_map<const jit::Node *, std::vector<std::string>> scopes;
  /// Node -> 1-based line in the `.ir` text.
  std::unordered_map<const jit::Node *, size_t> lines;

  llvm::Error runGraph(jit::Graph &graph, std::vector<c10::IValue> inputs,
                       std::optional<jit::Module> self,
                       const std::vector<std::string> &chain,
                       std::vector<c10::IValue> &outputs) {
    Frame frame;
    auto graphInputs = graph.inputs();
    if (graphInputs.size() != inputs.size())
      return makeError(llvm::formatv("{0}: a call passes {1} values to a graph "
                                     "with {2} inputs",
                                     file, inputs.size(), graphInputs.size()));
    for (size_t i = 0; i < inputs.size(); ++i)
      frame.values[graphInputs[i]] = inputs[i];
    if (self)
      frame.modules[graphInputs[0]] = {*self,
                                       chain.empty() ? "" : chain.back()};
    if (auto err = runBlock(*graph.block(), frame, chain))
      return err;
    for (jit::Value *out : graph.outputs())
      outputs.push_back(frame.values.at(out));
    return llvm::Error::success();
  }

private:
  struct ModuleRef {
    jit::Module module;
    std::string path;
  };
  struct Frame {
    std::unordered_map<const jit::Value *, c10::IValue> values;
    std::unordered_map<const jit::Value *, ModuleRef> modules;
  };

  std::string where(const jit::Node *node) const {
    if (auto it = lines.find(node); it != lines.end())
      return llvm::formatv("{0}:{1}:1", file, it->second).str();
    if (auto range = node->sourceRange().findSourceRangeThatGenerated())
      if (auto loc = range->file_line_col())
        return llvm::formatv("{0}:{1}:{2} (in {3})", std::get<0>(*loc),
                             std::get<1>(*loc), std::get<2>(*loc) + 1, file)
            .str();
    if (auto loc = node->sourceRange().file_line_col())
      return llvm::formatv("{0}:{1}:{2} (in {3})", std::get<0>(*loc),
                           std::get<1>(*loc), std::get<2>(*loc) + 1, file)
          .str();
    return file;
  }

  llvm::Error runBlock(jit::Block &block, Frame &frame,
                       const std::vector<std::string> &chain) {
    for (jit::Node *node : block.nodes())
      if (auto err = runNode(node, frame, chain))
        return err;
    return llvm::Error::success();
  }

  llvm::Error runNode(jit::Node *node, Frame &frame,
                      const std::vector<std::string> &chain) {
    auto kind = node->kind();
    auto input = [&](size_t i) -> const c10::IValue & {
      return frame.values.at(node->input(i));
    };
    if (kind == c10::prim::GetAttr) {
      auto it = frame.modules.find(node->input(0));
      std::string name = node->s(c10::attr::name);
      if (it == frame.modules.end()) {
        const c10::IValue &obj = input(0);
        if (!obj.isObject())
          return makeError(where(node) + ": prim::GetAttr on a non-object");
        frame.values[node->output()] = obj.toObject()->getAttr(name);
        return llvm::Error::success();
      }
      c10::IValue value = it->second.module.attr(name);
      std::string path =
          it->second.path.empty() ? name : it->second.path + "." + name;
      if (value.isModule())
        frame.modules[node->output()] = {value.toModule(), path};
      frame.values[node->output()] = value;
      return llvm::Error::success();
    }
    if (kind == c10::prim::CallMethod) {
      auto it = frame.modules.find(node->input(0));
      if (it == frame.modules.end())
        return makeError(where(node) +
                         ": prim::CallMethod on a value that is not a "
                         "submodule of the model");
      std::vector<std::string> inner = chain;
      inner.push_back(it->second.path);
      auto method = it->second.module.get_method(node->s(c10::attr::name));
      std::vector<c10::IValue> args;
      for (jit::Value *in : node->inputs())
        args.push_back(frame.values.at(in));
      std::vector<c10::IValue> outs;
      auto graph = jit::toGraphFunction(method.function()).graph();
      if (auto err = runGraph(*graph, args, it->second.module, inner, outs))
        return err;
      for (size_t i = 0; i < outs.size(); ++i)
        frame.values[node->output(i)] = outs[i];
      return llvm::Error::success();
    }
    if (kind == c10::prim::CallFunction) {
      auto fnType = node->input(0)->type()->cast<c10::FunctionType>();
      if (!fnType)
        return makeError(where(node) + ": prim::CallFunction without a "
                                       "function type");
      std::vector<c10::IValue> args;
      for (size_t i = 1; i < node->inputs().size(); ++i)
        args.push_back(input(i));
      std::vector<c10::IValue> outs;
      auto graph = jit::toGraphFunction(*fnType->function()).graph();
      if (auto err = runGraph(*graph, args, std::nullopt, chain, outs))
        return err;
      for (size_t i = 0; i < outs.size(); ++i)
        frame.values[node->output(i)] = outs[i];
      return llvm::Error::success();
    }
    if (kind == c10::prim::Constant) {
      auto value = jit::toIValue(node->output());
      if (!value)
        return makeError(where(node) + ": unsupported constant");
      frame.values[node->output()] = *value;
      return llvm::Error::success();
    }
    if (kind == c10::prim::If) {
      bool cond = input(0).toBool();
      jit::Block *taken = node->blocks()[cond ? 0 : 1];
      if (auto err = runBlock(*taken, frame, chain))
        return err;
      for (size_t i = 0; i < node->outputs().size(); ++i)
        frame.values[node->output(i)] = frame.values.at(taken->outputs()[i]);
      return llvm::Error::success();
    }
    if (kind == c10::prim::ListConstruct) {
      // Node-dependent prim ops have no schema; build their values here.
      auto listType = node->output()->type()->cast<c10::ListType>();
      if (!listType)
        return makeError(where(node) + ": prim::ListConstruct without a list "
                                       "type");
      c10::impl::GenericList list(listType->getElementType());
      for (jit::Value *in : node->inputs())
        list.push_back(frame.values.at(in));
      frame.values[node->output()] = c10::IValue(std::move(list));
      return llvm::Error::success();
    }
    if (kind == c10::prim::TupleConstruct) {
      std::vector<c10::IValue> items;
      for (jit::Value *in : node->inputs())
        items.push_back(frame.values.at(in));
      frame.values[node->output()] =
          c10::ivalue::Tuple::create(std::move(items));
      return llvm::Error::success();
    }
    if (kind == c10::prim::TupleUnpack || kind == c10::prim::ListUnpack) {
      const c10::IValue &whole = input(0);
      std::vector<c10::IValue> items;
      if (whole.isTuple())
        items = whole.toTupleRef().elements().vec();
      else if (whole.isList())
        items = whole.toListRef().vec();
      if (items.size() != node->outputs().size())
        return makeError(where(node) + ": cannot unpack " +
                         std::to_string(items.size()) + " values into " +
                         std::to_string(node->outputs().size()));
      for (size_t i = 0; i < items.size(); ++i)
        frame.values[node->output(i)] = items[i];
      return llvm::Error::success();
    }
    if (kind == c10::prim::TupleIndex) {
      const auto &items = input(0).toTupleRef().elements();
      int64_t index = input(1).toInt();
      if (index < 0)
        index += int64_t(items.size());
      frame.values[node->output()] = items.at(size_t(index));
      return llvm::Error::success();
    }
    if (!node->blocks().empty())
      return makeError(llvm::formatv("{0}: unsupported control flow '{1}'; "
                                     "trace the model (torch.jit.trace) so "
                                     "loops are unrolled",
                                     where(node), kind.toQualString()));
    // An ordinary op: run it through its registered operation.
    jit::Stack stack;
    for (jit::Value *in : node->inputs())
      stack.push_back(frame.values.at(in));
    try {
      jit::Operation op = node->getOperation();
      op(stack);
    } catch (const std::exception &e) {
      return makeError(llvm::formatv("{0}: cannot run '{1}' with the given "
                                     "input shapes: {2}",
                                     where(node), kind.toQualString(),
                                     firstLine(e.what())));
    }
    if (stack.size() != node->outputs().size())
      return makeError(where(node) + ": '" + kind.toQualString() +
                       "' returned the wrong number of values");
    for (size_t i = 0; i < stack.size(); ++i)
      frame.values[node->output(i)] = stack[i];
    if (kind.is_prim())
      return llvm::Error::success();
    OpRecord record;
    record.kind = kind.toQualString();
    record.where = where(node);
    record.chain = chain;
    if (auto it = scopes.find(node); it != scopes.end())
      record.chain.insert(record.chain.end(), it->second.begin(),
                          it->second.end());
    record.node = node;
    for (jit::Value *in : node->inputs())
      record.inputs.push_back(frame.values.at(in));
    record.outputs.assign(stack.begin(), stack.end());
    records.push_back(std::move(record));
    return llvm::Error::success();
  }

  std::vector<OpRecord> &records;
  std::string file;
};

//===----------------------------------------------------------------------===//
// Sidecar (OUT.json beside OUT.pt, written by the exporter).
//===----------------------------------------------------------------------===//

struct Sidecar {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> dtypes;
  std::map<std::string, int64_t> savedBytes;
  /// What each region's dx keeps for its dw, its dw reads of a replay and
  /// its outputs hold, where the exporter wrote them.
  std::map<std::string, int64_t> weightInputBytes, replayWeightBytes,
      outputBytes;
};

llvm::Expected<std::optional<Sidecar>> readSidecar(llvm::StringRef modelPath) {
  llvm::SmallString<256> path(modelPath);
  llvm::sys::path::replace_extension(path, ".json");
  if (!llvm::sys::fs::exists(path))
    return std::nullopt;
  auto buffer = mlir::hpr::readInputFile(path, "the exporter's sidecar");
  if (!buffer)
    return buffer.takeError();
  auto fail = [&](const std::string &jsonPath, const std::string &what) {
    return makeError(llvm::formatv("{0}: {1}: {2}", path, jsonPath, what));
  };
  nlohmann::json doc = nlohmann::json::parse(
      (*buffer)->getBuffer().begin(), (*buffer)->getBuffer().end(), nullptr,
      /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object())
    return fail("", "expected an exporter sidecar (a JSON object)");
  auto format = doc.find("format");
  if (format == doc.end() || !format->is_string() ||
      *format != "hp-recompute-export")
    return fail("/format", "expected \"hp-recompute-export\"");
  Sidecar sidecar;
  if (auto inputs = doc.find("inputs"); inputs != doc.end()) {
    if (!inputs->is_array())
      return fail("/inputs", "expected an array");
    for (size_t i = 0; i < inputs->size(); ++i) {
      const auto &in = (*inputs)[i];
      std::string at = llvm::formatv("/inputs/{0}", i).str();
      if (!in.is_object() || !in.contains("shape") || !in["shape"].is_array())
        return fail(at + "/shape", "expected an array of dimensions");
      std::vector<int64_t> shape;
      for (const auto &dim : in["shape"]) {
        if (!dim.is_number_integer() || dim.get<int64_t>() <= 0)
          return fail(at + "/shape", "expected positive integer dimensions");
        shape.push_back(dim.get<int64_t>());
      }
      sidecar.shapes.push_back(std::move(shape));
      if (!in.contains("dtype") || !in["dtype"].is_string())
        return fail(at + "/dtype", "expected a dtype name");
      sidecar.dtypes.push_back(in["dtype"].get<std::string>());
    }
  }
  if (auto regions = doc.find("regions"); regions != doc.end()) {
    if (!regions->is_array())
      return fail("/regions", "expected an array");
    for (size_t i = 0; i < regions->size(); ++i) {
      const auto &r = (*regions)[i];
      std::string at = llvm::formatv("/regions/{0}", i).str();
      if (!r.is_object() || !r.contains("name") || !r["name"].is_string())
        return fail(at + "/name", "expected a region name");
      if (!r.contains("saved_bytes") || !r["saved_bytes"].is_number_integer() ||
          r["saved_bytes"].get<int64_t>() < 0)
        return fail(at + "/saved_bytes", "expected a non-negative integer");
      sidecar.savedBytes[r["name"].get<std::string>()] =
          r["saved_bytes"].get<int64_t>();
      // What the dx keeps for the dw, the dw reads of a replay and the
      // outputs hold, where the exporter wrote them.
      for (auto [key, into] :
           {std::pair{"bwd_weight_input_bytes", &sidecar.weightInputBytes},
            std::pair{"replay_weight_bytes", &sidecar.replayWeightBytes},
            std::pair{"output_bytes", &sidecar.outputBytes}}) {
        auto bytes = r.find(key);
        if (bytes == r.end())
          continue;
        if (!bytes->is_number_integer() || bytes->get<int64_t>() < 0)
          return fail(at + "/" + key, "expected a non-negative integer");
        (*into)[r["name"].get<std::string>()] = bytes->get<int64_t>();
      }
    }
  }
  return sidecar;
}

//===----------------------------------------------------------------------===//
// IR text: strip `, scope: ...` and remember it per output value name.
//===----------------------------------------------------------------------===//

struct IrText {
  std::string text;
  std::map<std::string, std::vector<std::string>> scopes; // value -> stack
  std::map<std::string, size_t> lines;                    // value -> line
  std::map<std::string, double> nonFinite;     // constants parseIR cannot read
  std::map<std::string, double> scalarTensors; // `[value={4}]` constants
};

IrText prepareIr(llvm::StringRef text) {
  IrText ir;
  llvm::SmallVector<llvm::StringRef> lines;
  text.split(lines, '\n');
  for (size_t row = 0; row < lines.size(); ++row) {
    std::string line = lines[row].str();
    std::string name;
    llvm::StringRef trimmed = llvm::StringRef(line).ltrim();
    if (trimmed.starts_with("%")) {
      size_t end = trimmed.find_first_of(" :,=");
      name = trimmed
                 .substr(1, end == llvm::StringRef::npos ? llvm::StringRef::npos
                                                         : end - 1)
                 .str();
      ir.lines[name] = row + 1;
    }
    // torch prints inf/nan float constants that its own parser rejects.
    for (auto [spelled, value] :
         {std::pair<const char *, double>{"[value=-inf]", -INFINITY},
          {"[value=inf]", INFINITY},
          {"[value=nan]", NAN}}) {
      size_t at = line.find(spelled);
      if (at != std::string::npos && !name.empty()) {
        line.replace(at, std::strlen(spelled), "[value=0.]");
        ir.nonFinite[name] = value;
      }
    }
    // parseIR gives `{4}` tensor constants arbitrary contents; keep the value.
    if (size_t at = line.find("prim::Constant[value={");
        at != std::string::npos && !name.empty())
      ir.scalarTensors[name] = std::strtod(
          line.c_str() + at + std::strlen("prim::Constant[value={"), nullptr);
    size_t pos = line.find(", scope: ");
    if (pos != std::string::npos) {
      size_t start = pos + 9;
      size_t end = line.find_first_of(" #", start);
      std::string scope = line.substr(
          start, end == std::string::npos ? std::string::npos : end - start);
      line.erase(pos, (end == std::string::npos ? line.size() : end) - pos);
      std::vector<std::string> stack;
      llvm::SmallVector<llvm::StringRef> parts;
      llvm::StringRef(scope).split(parts, '/');
      for (llvm::StringRef part : parts) {
        part.consume_front("__module.");
        if (!part.empty())
          stack.push_back(part.str());
      }
      if (!name.empty())
        ir.scopes[name] = std::move(stack);
    }
    ir.text += line;
    ir.text += '\n';
  }
  return ir;
}

/// Turns parseIR's "... here:\n<line>\n   ~ <--- HERE" into FILE:ROW:COL.
std::string locateIrError(llvm::StringRef file, llvm::StringRef text,
                          const std::string &message) {
  llvm::SmallVector<llvm::StringRef> msgLines, textLines;
  llvm::StringRef(message).split(msgLines, '\n');
  text.split(textLines, '\n');
  size_t row = 1, col = 1;
  for (size_t i = 1; i < msgLines.size(); ++i) {
    if (!msgLines[i].contains("<--- HERE"))
      continue;
    col = msgLines[i].find('~') + 1;
    llvm::StringRef bad = msgLines[i - 1];
    for (size_t r = 0; r < textLines.size(); ++r)
      if (textLines[r] == bad) {
        row = r + 1;
        break;
      }
    break;
  }
  return llvm::formatv("{0}:{1}:{2}: invalid TorchScript IR: {3}", file, row,
                       col, firstLine(message))
      .str();
}

} // namespace

//===----------------------------------------------------------------------===//
// Entry point
//===----------------------------------------------------------------------===//

llvm::Expected<ModelGraph>
mlir::hpr::model::importTorchScript(llvm::StringRef path,
                                    const TorchScriptOptions &options,
                                    std::vector<std::string> *warnings) {
  std::string file = path.str();
  bool isIr = path.ends_with(".ir");
  if (!isIr && !path.ends_with(".pt"))
    return makeError(file + ": expected a TorchScript file ending in .pt or "
                            ".ir");
  if (options.regionDepth < 0)
    return makeError(llvm::formatv("{0}: region depth must be >= 0, got {1}",
                                   file, options.regionDepth));
  auto buffer = mlir::hpr::readInputFile(path, "",
                                         isIr ? mlir::hpr::InputKind::Text
                                              : mlir::hpr::InputKind::Archive);
  if (!buffer)
    return buffer.takeError();

  auto sidecar = readSidecar(path);
  if (!sidecar)
    return sidecar.takeError();
  std::vector<std::vector<int64_t>> shapes = options.inputShapes;
  std::string dtypeText = options.inputDtype;
  if (shapes.empty() && *sidecar && !(*sidecar)->shapes.empty()) {
    shapes = (*sidecar)->shapes;
    dtypeText = llvm::join((*sidecar)->dtypes, ",");
  }

  std::vector<OpRecord> records;
  ParamSet params;
  // Records point into these graphs; keep them alive until costs are done.
  std::optional<jit::Module> keepModule;
  std::shared_ptr<jit::Graph> keepGraph;
  torch::manual_seed(0);
  Runner runner(records, file);
  try {
    std::vector<c10::IValue> outs;
    if (!isIr) {
      if (auto err = checkZip(path, (*buffer)->getBuffer()))
        return err;
      jit::Module module;
      try {
        module = jit::load(file);
      } catch (const std::exception &e) {
        return makeError(file + ":1:1: cannot load the TorchScript archive: " +
                         firstLine(e.what()) + newerTorchHint());
      }
      module.train();
      keepModule = module;
      for (const auto &p : module.named_parameters(/*recurse=*/true)) {
        if (at::isFloatingType(p.value.scalar_type()))
          p.value.requires_grad_(true);
        params.add(p.value);
      }
      for (const auto &b : module.named_buffers(/*recurse=*/true))
        params.add(b.value);
      auto method = module.find_method("forward");
      if (!method)
        return makeError(file + ": the archive has no forward method");
      auto graph = jit::toGraphFunction(method->function()).graph();
      size_t numInputs = graph->inputs().size() - 1;
      if (shapes.size() != numInputs)
        return makeError(llvm::formatv(
            "{0}: forward takes {1} tensor inputs but {2} shapes were given; "
            "pass one per input with --input-shape (e.g. 4x40x48,4x40)",
            file, numInputs, shapes.size()));
      auto dtypes = parseDtypeList(dtypeText, numInputs);
      if (!dtypes)
        return dtypes.takeError();
      std::vector<c10::IValue> args{module._ivalue()};
      for (size_t i = 0; i < numInputs; ++i)
        args.push_back(dummyTensor(shapes[i], dtypeOf((*dtypes)[i])));
      if (auto err = runner.runGraph(*graph, args, module, {}, outs))
        return err;
    } else {
      IrText ir = prepareIr((*buffer)->getBuffer());
      auto graph = std::make_shared<jit::Graph>();
      keepGraph = graph;
      std::unordered_map<std::string, jit::Value *> vmap;
      try {
        jit::parseIR(ir.text, graph.get(), vmap,
                     /*parse_tensor_constants=*/true);
      } catch (const std::exception &e) {
        return makeError(locateIrError(file, ir.text, e.what()));
      }
      for (auto &[name, value] : ir.nonFinite)
        if (auto it = vmap.find(name); it != vmap.end())
          it->second->node()->f_(c10::attr::value, value);
      for (auto &[name, value] : ir.scalarTensors)
        if (auto it = vmap.find(name); it != vmap.end()) {
          auto type = it->second->type()->cast<c10::TensorType>();
          auto dtype =
              type && type->scalarType() ? *type->scalarType() : at::kDouble;
          it->second->node()->t_(
              c10::attr::value,
              at::scalar_tensor(value, at::TensorOptions().dtype(dtype)));
        }
      for (auto &[name, stack] : ir.scopes)
        if (auto it = vmap.find(name); it != vmap.end())
          runner.scopes[it->second->node()] = stack;
      for (auto &[name, line] : ir.lines)
        if (auto it = vmap.find(name); it != vmap.end())
          runner.lines[it->second->node()] = line;
      // Inputs named %self.* are parameters/buffers; the rest are data.
      std::vector<c10::IValue> args;
      size_t dataIndex = 0;
      std::vector<jit::Value *> dataInputs;
      for (jit::Value *in : graph->inputs())
        if (!llvm::StringRef(in->debugName()).starts_with("self."))
          dataInputs.push_back(in);
      std::vector<std::string> dtypes;
      if (!shapes.empty()) {
        if (shapes.size() != dataInputs.size())
          return makeError(llvm::formatv(
              "{0}: the graph takes {1} data inputs but {2} shapes were given",
              file, dataInputs.size(), shapes.size()));
        auto parsed = parseDtypeList(dtypeText, shapes.size());
        if (!parsed)
          return parsed.takeError();
        dtypes = *parsed;
      }
      for (jit::Value *in : graph->inputs()) {
        auto type = in->type()->cast<c10::TensorType>();
        bool isParam = llvm::StringRef(in->debugName()).starts_with("self.");
        if (!isParam && !shapes.empty()) {
          args.push_back(
              dummyTensor(shapes[dataIndex], dtypeOf(dtypes[dataIndex])));
          ++dataIndex;
          continue;
        }
        auto sizes = type ? type->sizes().concrete_sizes() : c10::nullopt;
        if (!type || !sizes || !type->scalarType())
          return makeError(llvm::formatv(
              "{0}:1:1: input '%{1}' has no complete tensor type (e.g. "
              "Float(4, 40, strides=[40, 1], requires_grad=0, device=cpu)); "
              "give its shape with --input-shape",
              file, in->debugName()));
        at::Tensor value = dummyTensor(*sizes, *type->scalarType());
        if (isParam) {
          if (type->requiresGrad().value_or(false) &&
              at::isFloatingType(value.scalar_type()))
            value.requires_grad_(true);
          params.add(value);
        }
        args.push_back(value);
      }
      if (auto err = runner.runGraph(*graph, args, std::nullopt, {}, outs))
        return err;
    }
  } catch (const std::exception &e) {
    return makeError(file + ": LibTorch error: " + firstLine(e.what()));
  }

  std::vector<OpFacts> ops;
  ops.reserve(records.size());
  for (const OpRecord &record : records)
    ops.push_back(factsOf(record));
  RegionOptions regionOptions;
  regionOptions.regionDepth = options.regionDepth;
  auto timeOps = [&](llvm::ArrayRef<size_t> indices) {
    return timeRecords(records, indices);
  };
  if (options.profile)
    regionOptions.timeOps = timeOps;
  std::vector<std::string> localWarnings;
  auto graph =
      buildRegions(file, ops, params.keys(), regionOptions, localWarnings);
  if (!graph)
    return graph.takeError();
  llvm::SmallString<64> stem(llvm::sys::path::stem(path));
  graph->name = stem.str().str();
  if (*sidecar)
    for (Region &region : graph->regions) {
      if (auto it = (*sidecar)->savedBytes.find(region.name);
          it != (*sidecar)->savedBytes.end())
        region.savedBytes = it->second;
      if (auto it = (*sidecar)->weightInputBytes.find(region.name);
          it != (*sidecar)->weightInputBytes.end())
        region.bwdWeightInputBytes = it->second;
      if (auto it = (*sidecar)->replayWeightBytes.find(region.name);
          it != (*sidecar)->replayWeightBytes.end())
        region.replayWeightBytes = it->second;
      if (auto it = (*sidecar)->outputBytes.find(region.name);
          it != (*sidecar)->outputBytes.end())
        region.outputBytes = it->second;
    }
  for (const std::string &w : localWarnings) {
    if (warnings)
      warnings->push_back(w);
    else
      llvm::errs() << w << "\n";
  }
  return graph;
}
