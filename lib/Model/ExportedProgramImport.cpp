//===- ExportedProgramImport.cpp - Import torch.export programs -----------===//
//
// Reads the serialized ExportedProgram of a `.pt2` archive (schema: torch's
// torch/_export/serde/schema.py, version 8) and describes each call of an
// ATen op to the region rules of RegionCosts.cpp:
//
//  - Tensor facts come from `graph.tensor_values`: sizes (a symbolic size
//    takes its example value, the hint), strides and dtype.
//  - Storage identity is derived, since the program records none: a view op
//    shares its input's storage; reshape/flatten do so when ATen's view rule
//    allows, contiguous/to when they return their input; in-place ops share
//    their first argument's; every other result is a new storage.
//  - requires_grad is derived as autograd would: parameters that require
//    grad, then every floating-point result of an op with such an input.
//  - The module call stack is the node's `nn_module_stack` metadata.
//
// A field of the wrong JSON type is an error naming the node or tensor, the
// field's JSON path and the type expected; nothing here lets nlohmann throw.
//
//===----------------------------------------------------------------------===//

#include "hpr/Model/ExportedProgramImport.h"

#include "RegionCosts.h"

#include "hpr/Support/Error.h"
#include "hpr/Support/InputFile.h"
#include "hpr/Support/Json.h"
#include "hpr/Support/ZipArchive.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

using namespace mlir::hpr::model;
using mlir::hpr::makeError;
using namespace mlir::hpr::model::detail;
using nlohmann::json;

namespace {

/// The schema major version this reader understands (torch.export's
/// SCHEMA_VERSION; minor versions only add fields).
constexpr int kSchemaMajor = 8;

/// `object[key]`, or null when \p object is not an object or has no such key
/// (nlohmann's const operator[] must not be used on a missing key).
const json &field(const json &object, const char *key) {
  static const json null;
  if (!object.is_object())
    return null;
  auto it = object.find(key);
  return it == object.end() ? null : *it;
}

/// Element size of a serde ScalarType, or 0 when unknown.
int64_t elementSize(int64_t dtype) {
  switch (dtype) {
  case 1:  // uint8
  case 2:  // int8
  case 12: // bool
  case 29: // float8 variants
  case 30:
  case 31:
  case 32:
  case 33:
    return 1;
  case 3:  // int16
  case 6:  // float16
  case 13: // bfloat16
  case 28: // uint16
    return 2;
  case 4:  // int32
  case 7:  // float32
  case 9:  // complex32
  case 34: // uint32
    return 4;
  case 5:  // int64
  case 8:  // float64
  case 10: // complex64
  case 35: // uint64
    return 8;
  case 11: // complex128
    return 16;
  default:
    return 0;
  }
}

bool isFloating(int64_t dtype) {
  return (dtype >= 6 && dtype <= 11) || dtype == 13 ||
         (dtype >= 29 && dtype <= 33);
}

/// Tensors with more dimensions than this are refused (no torch op handles
/// so many; the bound keeps every per-dimension walk small).
constexpr size_t kMaxRank = 64;

/// Tensors larger than this are refused: it keeps every byte count and sum
/// of them far from int64 overflow.
constexpr int64_t kMaxTensorBytes = int64_t(1) << 50;

/// The bytes a strided tensor reaches (and its element count does), or
/// nullopt beyond kMaxTensorBytes.
std::optional<int64_t> spannedBytes(const TensorFacts &facts) {
  int64_t elements = 1, span = 1;
  for (size_t d = 0; d < facts.sizes.size(); ++d) {
    int64_t size = facts.sizes[d], reach;
    if (size == 0)
      return 0;
    if (facts.strides[d] == INT64_MIN ||
        __builtin_mul_overflow(elements, size, &elements) ||
        __builtin_mul_overflow(size - 1, std::abs(facts.strides[d]), &reach) ||
        __builtin_add_overflow(span, reach, &span))
      return std::nullopt;
  }
  int64_t bytes = std::max(elements, span), total;
  if (__builtin_mul_overflow(bytes, facts.elementSize, &total) ||
      total > kMaxTensorBytes)
    return std::nullopt;
  return span * facts.elementSize;
}

/// Ops that may return their input instead of a new tensor, and when.
const llvm::StringSet<> kMaybeViews = {"aten::reshape",    "aten::flatten",
                                       "aten::reshape_as", "aten::contiguous",
                                       "aten::to",         "aten::type_as"};

/// Results that never require grad whatever their inputs.
const llvm::StringSet<> kNoGrad = {"aten::detach",          "aten::lift_fresh",
                                   "aten::lift_fresh_copy", "aten::zeros_like",
                                   "aten::ones_like",       "aten::empty_like"};

class ProgramReader {
public:
  ProgramReader(std::string file, int regionDepth,
                std::vector<std::string> &warnings)
      : file(std::move(file)), regionDepth(regionDepth), warnings(warnings) {}

  llvm::Expected<ModelGraph> read(const json &program);

private:
  struct Value {
    TensorFacts facts;
    int64_t dtype = 0;
    int64_t spanBytes = 0; ///< bytes its sizes and strides reach
  };

  llvm::Error fail(const llvm::Twine &where, const llvm::Twine &what) {
    return makeError(file + ": " + where + ": " + what);
  }
  /// The field at JSON path \p path of the node or tensor \p where is not
  /// \p expected.
  llvm::Error wrongType(const llvm::Twine &where, const llvm::Twine &path,
                        llvm::StringRef expected, const json &got) {
    return fail(where, path + ": expected " + expected + ", got " +
                           mlir::hpr::quoteJson(got));
  }

  llvm::Expected<int64_t> symInt(const json &value, llvm::StringRef tensor,
                                 const std::string &path);
  llvm::Error readTensorValues(const json &graph);
  llvm::Error readSignature(const json &graphModule);
  llvm::Expected<OpArg> readArg(const json &arg, const std::string &where,
                                const std::string &path);
  llvm::Expected<OpFacts> readNode(const json &node, size_t index);
  llvm::Error moduleChain(const json &node, const std::string &where,
                          const std::string &path, OpFacts &op);
  void placeResult(OpFacts &op, Value &result, size_t index);

  std::string file;
  int regionDepth;
  std::vector<std::string> &warnings;
  std::map<std::string, Value> values;
  std::set<uint64_t> params;
  uint64_t nextStorage = 1;
};

/// A SymInt: `{"as_int": N}`, or `{"as_expr": {"expr_str": .., "hint": ..}}`
/// whose hint is the example size export traced with.
llvm::Expected<int64_t> ProgramReader::symInt(const json &value,
                                              llvm::StringRef tensor,
                                              const std::string &path) {
  if (value.is_object()) {
    if (auto it = value.find("as_int");
        it != value.end() && it->is_number_integer())
      return it->get<int64_t>();
    if (auto it = value.find("as_expr"); it != value.end() && it->is_object()) {
      const json &text = field(*it, "expr_str");
      std::string expr = text.is_string() ? text.get<std::string>() : "?";
      const json *hint = it->contains("hint") ? &field(*it, "hint") : nullptr;
      if (hint && hint->is_object() && hint->contains("as_int") &&
          field(*hint, "as_int").is_number_integer())
        return field(*hint, "as_int").get<int64_t>();
      if (hint && hint->is_number_integer())
        return hint->get<int64_t>();
      return fail("tensor '" + tensor + "'",
                  "symbolic size '" + expr +
                      "' has no example value (hint); export with static "
                      "shapes, or from example inputs that give every "
                      "dynamic dimension a size");
    }
  }
  return wrongType("tensor '" + tensor + "'", path,
                   "a size {\"as_int\": N} or {\"as_expr\": ...}", value);
}

llvm::Error ProgramReader::readTensorValues(const json &graph) {
  const json &tensors = field(graph, "tensor_values");
  if (!tensors.is_object())
    return fail("/graph_module/graph", "expected an object 'tensor_values'");
  for (const auto &[name, meta] : tensors.items()) {
    std::string where = "tensor '" + name + "'";
    std::string path = "/graph_module/graph/tensor_values/" + name;
    if (!meta.is_object())
      return wrongType(where, path, "an object {\"sizes\", \"strides\", ...}",
                       meta);
    for (const char *key : {"sizes", "strides"})
      if (!field(meta, key).is_array())
        return wrongType(where, path + "/" + key, "an array", field(meta, key));
    if (!field(meta, "dtype").is_number_integer())
      return wrongType(where, path + "/dtype", "an integer (a ScalarType)",
                       field(meta, "dtype"));
    const json &requiresGrad = field(meta, "requires_grad");
    if (!requiresGrad.is_null() && !requiresGrad.is_boolean())
      return wrongType(where, path + "/requires_grad", "true or false",
                       requiresGrad);
    if (field(meta, "sizes").size() > kMaxRank)
      return fail(where, llvm::formatv("{0} dimensions, more than the {1} "
                                       "this importer reads",
                                       field(meta, "sizes").size(), kMaxRank));
    Value value;
    value.dtype = field(meta, "dtype").get<int64_t>();
    value.facts.elementSize = elementSize(value.dtype);
    if (!value.facts.elementSize)
      return fail(where, "unknown dtype " + std::to_string(value.dtype));
    for (auto [d, size] : llvm::enumerate(field(meta, "sizes"))) {
      auto n = symInt(size, name, path + "/sizes/" + std::to_string(d));
      if (!n)
        return n.takeError();
      if (*n < 0)
        return fail(where, "negative size");
      value.facts.sizes.push_back(*n);
    }
    for (auto [d, stride] : llvm::enumerate(field(meta, "strides"))) {
      auto n = symInt(stride, name, path + "/strides/" + std::to_string(d));
      if (!n)
        return n.takeError();
      value.facts.strides.push_back(*n);
    }
    if (value.facts.strides.size() != value.facts.sizes.size())
      return fail(where, "sizes and strides differ in length");
    std::optional<int64_t> span = spannedBytes(value.facts);
    if (!span)
      return fail(where, "its sizes and strides reach more than 2^50 bytes");
    value.spanBytes = *span;
    value.facts.requiresGrad = requiresGrad.is_boolean() &&
                               requiresGrad.get<bool>() &&
                               isFloating(value.dtype);
    values[name] = std::move(value);
  }
  return llvm::Error::success();
}

/// Gives every graph input a storage of its own; parameters, buffers and
/// constants go to `params`.
llvm::Error ProgramReader::readSignature(const json &graphModule) {
  const json &specs = field(field(graphModule, "signature"), "input_specs");
  if (!specs.is_array())
    return fail("/graph_module/signature", "expected an array 'input_specs'");
  for (const json &spec : specs) {
    if (!spec.is_object() || spec.size() != 1)
      return fail("/graph_module/signature/input_specs",
                  "expected one input kind per spec, got " +
                      mlir::hpr::quoteJson(spec));
    const std::string &kind = spec.begin().key();
    const json &body = spec.begin().value();
    const json *arg = body.is_object() && body.contains("arg")
                          ? &field(body, "arg")
                          : nullptr;
    if (!arg || !arg->is_object())
      continue; // tokens, constant inputs: no tensor
    const json *tensor =
        arg->contains("as_tensor") ? &field(*arg, "as_tensor") : arg;
    if (!tensor->is_object() || !field(*tensor, "name").is_string())
      continue;
    std::string name = field(*tensor, "name").get<std::string>();
    auto it = values.find(name);
    if (it == values.end())
      return fail("input '" + name + "'", "not in tensor_values");
    TensorFacts &facts = it->second.facts;
    facts.storage = nextStorage++;
    facts.storageBytes = facts.nbytes();
    if (kind == "parameter" || kind == "buffer" || kind == "tensor_constant")
      params.insert(facts.storage);
    if (kind != "parameter")
      facts.requiresGrad = false; // buffers, constants and user data
  }
  return llvm::Error::success();
}

llvm::Expected<OpArg> ProgramReader::readArg(const json &arg,
                                             const std::string &where,
                                             const std::string &path) {
  OpArg result;
  if (!arg.is_object() || arg.size() != 1)
    return result; // as_none and friends: nothing the rules read
  const std::string &kind = arg.begin().key();
  const json &body = arg.begin().value();
  std::string at = path + "/" + kind;
  auto tensorNamed =
      [&](const json &ref,
          const std::string &refPath) -> llvm::Expected<TensorFacts> {
    if (!ref.is_object() || !field(ref, "name").is_string())
      return wrongType(where, refPath, "a tensor reference {\"name\": ...}",
                       ref);
    auto it = values.find(field(ref, "name").get<std::string>());
    if (it == values.end() || !it->second.facts.storage)
      return fail(where, "tensor '" + field(ref, "name").get<std::string>() +
                             "' is used before it is defined");
    return it->second.facts;
  };
  if (kind == "as_tensor") {
    auto facts = tensorNamed(body, at);
    if (!facts)
      return facts.takeError();
    result.kind = OpArg::Kind::Tensor;
    result.tensors.push_back(std::move(*facts));
  } else if (kind == "as_tensors" || kind == "as_optional_tensors") {
    if (!body.is_array())
      return wrongType(where, at, "an array", body);
    result.kind = OpArg::Kind::TensorList;
    for (auto [i, item] : llvm::enumerate(body)) {
      const json &ref = kind == "as_tensors"
                            ? item
                            : (item.is_object() && item.contains("as_tensor")
                                   ? field(item, "as_tensor")
                                   : json());
      if (ref.is_null())
        continue; // None in an optional list
      auto facts = tensorNamed(ref, at + "/" + std::to_string(i));
      if (!facts)
        return facts.takeError();
      result.tensors.push_back(std::move(*facts));
    }
  } else if (kind == "as_int" && body.is_number_integer()) {
    result.kind = OpArg::Kind::Int;
    result.intValue = body.get<int64_t>();
  } else if (kind == "as_sym_int" && body.is_object() &&
             body.contains("as_int") &&
             field(body, "as_int").is_number_integer()) {
    result.kind = OpArg::Kind::Int;
    result.intValue = field(body, "as_int").get<int64_t>();
  } else if (kind == "as_float" && body.is_number()) {
    result.kind = OpArg::Kind::Double;
    result.doubleValue = body.get<double>();
  } else if (kind == "as_bool" && body.is_boolean()) {
    result.kind = OpArg::Kind::Bool;
    result.boolValue = body.get<bool>();
  } else if ((kind == "as_ints" || kind == "as_sym_ints") && body.is_array()) {
    result.kind = OpArg::Kind::IntList;
    for (const json &item : body) {
      if (item.is_number_integer())
        result.ints.push_back(item.get<int64_t>());
      else if (item.is_object() && item.contains("as_int") &&
               field(item, "as_int").is_number_integer())
        result.ints.push_back(field(item, "as_int").get<int64_t>());
      else
        return fail(where, at + ": symbolic int list element " +
                               mlir::hpr::quoteJson(item) +
                               " has no example value");
    }
  }
  return result;
}

/// The node's module call stack, outermost first, from `nn_module_stack`
/// ("KEY,FQN,TYPE;KEY,FQN,TYPE;..."), into \p op: the root module (FQN "") is
/// left out, and a module whose call is marked repeated (an `@N` suffix on its
/// key or FQN) noted in `repeatedCalls`, without the suffix (segmentOps refuses
/// a region's module called more than once).
llvm::Error ProgramReader::moduleChain(const json &node,
                                       const std::string &where,
                                       const std::string &path, OpFacts &op) {
  const json &meta = field(node, "metadata");
  const json &stack = field(meta, "nn_module_stack");
  if (stack.is_null())
    return llvm::Error::success();
  if (!stack.is_string())
    return wrongType(where, path + "/metadata/nn_module_stack",
                     "a string \"KEY,FQN,TYPE;...\"", stack);
  llvm::SmallVector<llvm::StringRef> entries;
  llvm::StringRef(stack.get_ref<const std::string &>())
      .split(entries, ';', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef entry : entries) {
    // torch.export marks a repeated call in the key ("L__self__blocks.0@1");
    // the FQN may carry the suffix too.
    auto [key, rest] = entry.split(',');
    auto [fqn, call] = rest.split(',').first.split('@');
    if (fqn.empty())
      continue;
    op.chain.push_back(fqn.str());
    if (!call.empty() || key.contains('@'))
      op.repeatedCalls.push_back(fqn.str());
  }
  return llvm::Error::success();
}

/// Gives a result its storage (see the file comment) and requires_grad.
void ProgramReader::placeResult(OpFacts &op, Value &result, size_t index) {
  TensorFacts &facts = result.facts;
  bool anyGrad = false;
  for (const OpArg &arg : op.inputs)
    for (const TensorFacts &t : arg.tensors)
      anyGrad |= t.requiresGrad;
  facts.requiresGrad =
      anyGrad && isFloating(result.dtype) && !kNoGrad.contains(op.kind);
  const TensorFacts *self = op.input(0);
  bool aliases = false;
  if (self) {
    llvm::StringRef kind = op.kind;
    if (isViewOp(kind) && !kMaybeViews.contains(kind))
      aliases = true;
    else if (kind == "aten::reshape" || kind == "aten::flatten" ||
             kind == "aten::reshape_as")
      aliases = isViewable(self->sizes, self->strides, facts.sizes);
    else if (kind == "aten::contiguous")
      aliases = self->isContiguous();
    else if (kind == "aten::to" || kind == "aten::type_as")
      aliases =
          self->elementSize == facts.elementSize && self->sizes == facts.sizes;
    else if (kind.ends_with("_") && !kind.ends_with("__") && index == 0)
      aliases = true; // in place: the result is its first argument
  }
  if (aliases) {
    facts.storage = self->storage;
    facts.storageBytes = self->storageBytes;
    return;
  }
  facts.storage = nextStorage++;
  facts.storageBytes = result.spanBytes;
}

llvm::Expected<OpFacts> ProgramReader::readNode(const json &node,
                                                size_t index) {
  std::string path = "/graph_module/graph/nodes/" + std::to_string(index);
  const json &nameField = field(node, "name");
  if (!nameField.is_null() && !nameField.is_string())
    return wrongType("node #" + std::to_string(index), path + "/name",
                     "a string", nameField);
  std::string name = nameField.is_string() ? nameField.get<std::string>()
                                           : "#" + std::to_string(index);
  if (!field(node, "target").is_string())
    return wrongType("node '" + name + "'", path + "/target",
                     "a string (the op, e.g. torch.ops.aten.linear.default)",
                     field(node, "target"));
  std::string target = field(node, "target").get<std::string>();
  std::string where = "node '" + name + "' (" + target + ")";
  OpFacts op;
  // torch.ops.aten.linear.default -> aten::linear
  op.kind = canonicalOpKind(target);
  llvm::StringRef qualified = llvm::StringRef(target);
  qualified.consume_front("torch.ops.");
  llvm::SmallVector<llvm::StringRef> parts;
  qualified.split(parts, '.');
  op.where = file + ": " + where;
  // Counted 0, these would plan a model whose costs are not its own.
  bool torchOp = target != qualified && parts.size() >= 2;
  if (torchOp && parts[0] == "higher_order")
    return fail(where, "higher-order op '" + parts[1] +
                           "' (torch.cond, while_loop, ...): its body is a "
                           "subgraph this importer cannot price; export "
                           "without it, or give the model as model JSON "
                           "with measured costs (docs/models.md)");
  if (torchOp && parts[0] != "aten" && parts[0] != "prims")
    return fail(where, "custom op '" + op.kind +
                           "' has no cost rule (its FLOPs and saved tensors "
                           "are unknown); export with it decomposed into "
                           "aten ops, or give the model as model JSON with "
                           "measured costs (docs/models.md)");
  if (auto err = moduleChain(node, where, path, op))
    return err;
  if (!field(node, "inputs").is_array() || !field(node, "outputs").is_array())
    return fail(where, path + ": expected arrays 'inputs' and 'outputs'");
  for (auto [i, input] : llvm::enumerate(field(node, "inputs"))) {
    std::string inputPath = path + "/inputs/" + std::to_string(i);
    if (!input.is_object() || !input.contains("arg"))
      return wrongType(where, inputPath, "an input {\"name\", \"arg\"}", input);
    auto arg = readArg(field(input, "arg"), where, inputPath + "/arg");
    if (!arg)
      return arg.takeError();
    op.inputs.push_back(std::move(*arg));
  }
  size_t resultIndex = 0;
  for (const json &output : field(node, "outputs")) {
    OpArg result;
    auto define = [&](const json &ref) -> llvm::Error {
      if (!ref.is_object() || !field(ref, "name").is_string())
        return llvm::Error::success();
      std::string out = field(ref, "name").get<std::string>();
      auto it = values.find(out);
      if (it == values.end())
        return fail(where, "result '" + out + "' is not in tensor_values");
      if (it->second.facts.storage)
        return fail(where, "result '" + out + "' is defined twice");
      placeResult(op, it->second, resultIndex++);
      result.tensors.push_back(it->second.facts);
      return llvm::Error::success();
    };
    if (!output.is_object() || output.size() != 1) {
      op.outputs.push_back(std::move(result));
      continue;
    }
    const std::string &kind = output.begin().key();
    const json &body = output.begin().value();
    if (kind == "as_tensor") {
      result.kind = OpArg::Kind::Tensor;
      if (auto err = define(body))
        return err;
    } else if (kind == "as_tensors" && body.is_array()) {
      result.kind = OpArg::Kind::TensorList;
      for (const json &ref : body)
        if (auto err = define(ref))
          return err;
    }
    if (result.kind == OpArg::Kind::Tensor && result.tensors.empty())
      result.kind = OpArg::Kind::None;
    op.outputs.push_back(std::move(result));
  }
  return op;
}

llvm::Expected<ModelGraph> ProgramReader::read(const json &program) {
  if (!program.is_object())
    return fail("/", "expected a serialized ExportedProgram object");
  const json &version = field(program, "schema_version");
  if (!version.is_object() || !field(version, "major").is_number_integer())
    return fail("/schema_version",
                "missing; expected a program written by torch.export.save");
  int64_t major = field(version, "major").get<int64_t>();
  const json &minor = field(version, "minor");
  if (major != kSchemaMajor)
    return fail("/schema_version",
                llvm::formatv(
                    "schema version {0}.{1} is not supported; this "
                    "importer reads version {2}.x (torch 2.6 and "
                    "later); export the model again with such a "
                    "torch",
                    major, minor.is_number_integer() ? minor.get<int64_t>() : 0,
                    kSchemaMajor));
  const json &graphModule = field(program, "graph_module");
  if (!graphModule.is_object() || !field(graphModule, "graph").is_object())
    return fail("/graph_module", "expected an object with a 'graph'");
  const json &graph = field(graphModule, "graph");
  if (auto err = readTensorValues(graph))
    return err;
  if (auto err = readSignature(graphModule))
    return err;
  if (!field(graph, "nodes").is_array())
    return fail("/graph_module/graph", "expected an array 'nodes'");
  std::vector<OpFacts> ops;
  size_t index = 0;
  for (const json &node : field(graph, "nodes")) {
    if (!node.is_object())
      return fail("/graph_module/graph/nodes/" + std::to_string(index),
                  "expected a node object");
    auto op = readNode(node, index++);
    if (!op)
      return op.takeError();
    ops.push_back(std::move(*op));
  }
  if (ops.empty())
    return fail("/graph_module/graph", "the program calls no op");
  RegionOptions options;
  options.regionDepth = regionDepth;
  return buildRegions(file, ops, params, options, warnings);
}

/// The serialized program inside a `.pt2`: `<root>/models/model.json`
/// (torch 2.6 and later), or `serialized_exported_program.json` (earlier).
std::optional<std::string> programEntry(const std::vector<std::string> &names) {
  for (const std::string &name : names)
    if (llvm::StringRef(name).ends_with("/models/model.json") ||
        name == "models/model.json")
      return name;
  for (const std::string &name : names)
    if (llvm::sys::path::filename(name) == "serialized_exported_program.json")
      return name;
  return std::nullopt;
}

} // namespace

llvm::Expected<ModelGraph> mlir::hpr::model::importExportedProgramJson(
    llvm::StringRef text, llvm::StringRef fileName, int regionDepth,
    std::vector<std::string> &warnings) {
  auto program = mlir::hpr::parseJson(text, fileName, /*maxDepth=*/128);
  if (!program)
    return program.takeError();
  ProgramReader reader(fileName.str(), regionDepth, warnings);
  try {
    return reader.read(*program);
  } catch (const json::exception &e) {
    // A field of the wrong JSON type somewhere the reader indexes.
    return makeError(fileName + ": malformed program: " + e.what());
  }
}

llvm::Expected<ModelGraph>
mlir::hpr::model::importExportedProgram(llvm::StringRef path, int regionDepth,
                                        std::vector<std::string> &warnings) {
  auto buffer =
      mlir::hpr::readInputFile(path, "", mlir::hpr::InputKind::Archive);
  if (!buffer)
    return buffer.takeError();
  auto archive = mlir::hpr::ZipArchive::open((*buffer)->getBuffer(), path,
                                             "torch.export archive");
  if (!archive)
    return makeError(llvm::toString(archive.takeError()) +
                     "; expected a file written by torch.export.save");
  std::optional<std::string> entry = programEntry(archive->names());
  if (!entry)
    return makeError(path + ": the archive holds no serialized program "
                            "(models/model.json); expected a file written by "
                            "torch.export.save");
  auto text = archive->read(*entry);
  if (!text)
    return text.takeError();
  auto graph = importExportedProgramJson(*text, (path + ":" + *entry).str(),
                                         regionDepth, warnings);
  if (!graph)
    return graph.takeError();
  graph->name = llvm::sys::path::stem(path).str();
  return graph;
}
