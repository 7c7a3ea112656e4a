//===- ExportedProgramImportTest.cpp - torch.export (.pt2) import ---------===//
//
// The program reader on hand-written serialized programs (values derived by
// hand from the rules in docs/models.md), its errors, and the view rule it
// uses for reshape, checked against cases torch itself decided
// (`Tensor.view` succeeds or raises).
//
//===----------------------------------------------------------------------===//

#include "RegionCosts.h"
#include "Scratch.h"

#include "hpr/Model/ExportedProgramImport.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include "gtest/gtest.h"

#include <minizip/zip.h>
#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <cstdint>
#include <functional>

using namespace mlir::hpr::model;
using nlohmann::json;

namespace {

json tensorMeta(std::vector<int64_t> sizes, int dtype = 7,
                bool requiresGrad = false) {
  json t = {{"dtype", dtype},
            {"requires_grad", requiresGrad},
            {"sizes", json::array()},
            {"strides", json::array()}};
  int64_t stride = 1;
  std::vector<int64_t> strides(sizes.size());
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= sizes[d];
  }
  for (size_t d = 0; d < sizes.size(); ++d) {
    t["sizes"].push_back({{"as_int", sizes[d]}});
    t["strides"].push_back({{"as_int", strides[d]}});
  }
  return t;
}

json ref(const char *name) { return {{"as_tensor", {{"name", name}}}}; }

json node(const char *target, std::vector<json> args, const char *out,
          const char *stack) {
  json n = {{"target", target},
            {"name", out},
            {"inputs", json::array()},
            {"outputs", json::array({ref(out)})},
            {"metadata", {{"nn_module_stack", stack}}}};
  for (json &arg : args)
    n["inputs"].push_back({{"name", "a"}, {"arg", arg}});
  return n;
}

/// y = layers.0.fc(x); z = relu(y) in layers.0; loss = sum(z) outside.
json program() {
  const char *inBlock = "L__self__,,M;L__self__layers.0,layers.0,Block;"
                        "L__self__layers.0.fc,layers.0.fc,Linear";
  json graph = {{"tensor_values",
                 {{"x", tensorMeta({2, 4})},
                  {"w", tensorMeta({3, 4}, 7, true)},
                  {"y", tensorMeta({2, 3})},
                  {"z", tensorMeta({2, 3})},
                  {"loss", tensorMeta({})}}},
                {"nodes",
                 {node("torch.ops.aten.linear.default", {ref("x"), ref("w")},
                       "y", inBlock),
                  node("torch.ops.aten.relu.default", {ref("y")}, "z",
                       "L__self__,,M;L__self__layers.0,layers.0,Block"),
                  node("torch.ops.aten.sum.default", {ref("z")}, "loss",
                       "L__self__,,M")}}};
  json signature = {
      {"input_specs",
       {{{"parameter",
          {{"arg", {{"name", "w"}}}, {"parameter_name", "layers.0.fc.w"}}}},
        {{"user_input", {{"arg", ref("x")}}}}}}};
  return {{"schema_version", {{"major", 8}, {"minor", 20}}},
          {"graph_module", {{"graph", graph}, {"signature", signature}}}};
}

std::string programError(const json &p) {
  std::vector<std::string> warnings;
  auto graph = importExportedProgramJson(p.dump(), "p.json", 1, warnings);
  if (graph)
    return "<no error>";
  return llvm::toString(graph.takeError());
}

TEST(ExportedProgramImport, RegionsAndCostsFollowTheRules) {
  std::vector<std::string> warnings;
  auto graph =
      importExportedProgramJson(program().dump(), "p.json", 1, warnings);
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  EXPECT_TRUE(warnings.empty());
  ASSERT_EQ(graph->regions.size(), 2u);
  const Region &block = graph->regions[0];
  EXPECT_EQ(block.name, "layers.0");
  EXPECT_TRUE(block.checkpointable);
  // linear: 2 * numel(y) * K = 2 * 6 * 4; relu: 6 (one per element).
  EXPECT_EQ(block.fwdFlops, 48 + 6);
  // linear saves x (w needs grad; x does not, so w is not saved); relu saves
  // its output z, which requires grad through w.
  EXPECT_EQ(block.savedBytes, 2 * 4 * 4 + 2 * 3 * 4);
  EXPECT_EQ(block.inputBytes, 2 * 4 * 4);
  EXPECT_EQ(block.paramBytes, 3 * 4 * 4);
  const Region &tail = graph->regions[1];
  EXPECT_EQ(tail.name, "top");
  EXPECT_FALSE(tail.checkpointable);
  EXPECT_EQ(tail.inputBytes, 2 * 3 * 4); // z, made by layers.0
}

TEST(ExportedProgramImport, UnknownOpIsAWarningNamingOpAndRegion) {
  json p = program();
  p["graph_module"]["graph"]["nodes"][1]["target"] =
      "torch.ops.aten.hardswish.default";
  std::vector<std::string> warnings;
  auto graph = importExportedProgramJson(p.dump(), "p.json", 1, warnings);
  ASSERT_TRUE(bool(graph));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("p.json: node 'z' "
                             "(torch.ops.aten.hardswish.default): warning: no "
                             "cost rule for 'aten::hardswish' (in region "
                             "'layers.0')"),
            std::string::npos)
      << warnings[0];
}

TEST(ExportedProgramImport, Errors) {
  json p = program();
  p["schema_version"]["major"] = 3;
  EXPECT_NE(
      programError(p).find("p.json: /schema_version: schema version 3.20 is "
                           "not supported"),
      std::string::npos);
  p = program();
  p["graph_module"]["graph"]["nodes"][0]["inputs"][0]["arg"] = ref("nope");
  EXPECT_NE(
      programError(p).find("p.json: node 'y' "
                           "(torch.ops.aten.linear.default): tensor 'nope' "
                           "is used before it is defined"),
      std::string::npos)
      << programError(p);
  p = program();
  p["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0] = {
      {"as_expr", {{"expr_str", "s0"}}}};
  EXPECT_NE(
      programError(p).find("p.json: tensor 'x': symbolic size 's0' has no "
                           "example value (hint)"),
      std::string::npos)
      << programError(p);
  // With a hint, the example size is used.
  p["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0] = {
      {"as_expr", {{"expr_str", "s0"}, {"hint", {{"as_int", 2}}}}}};
  EXPECT_EQ(programError(p), "<no error>");
  // Sizes whose element count or byte span overflows int64 are refused.
  p = program();
  p["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0] = {
      {"as_int", int64_t(1) << 62}};
  EXPECT_NE(
      programError(p).find("p.json: tensor 'x': its sizes and strides reach "
                           "more than 2^50 bytes"),
      std::string::npos)
      << programError(p);
  p = program();
  p["graph_module"]["graph"]["tensor_values"]["x"]["strides"][0] = {
      {"as_int", INT64_MIN}};
  EXPECT_NE(programError(p).find("its sizes and strides reach more than 2^50"),
            std::string::npos)
      << programError(p);
  p = program();
  p["graph_module"]["graph"]["tensor_values"]["x"]["dtype"] = 77;
  EXPECT_NE(programError(p).find("p.json: tensor 'x': unknown dtype 77"),
            std::string::npos);
  p = program();
  p["graph_module"]["graph"]["nodes"] = json::array();
  EXPECT_NE(programError(p).find("the program calls no op"), std::string::npos);
  p = program();
  p["graph_module"]["graph"]["nodes"][0]["outputs"] = 5;
  EXPECT_NE(programError(p).find("expected arrays 'inputs' and 'outputs'"),
            std::string::npos);
  EXPECT_NE(programError(json::array())
                .find("expected a serialized "
                      "ExportedProgram object"),
            std::string::npos);
}

TEST(ExportedProgramImport, MissingArchive) {
  std::vector<std::string> warnings;
  auto graph = importExportedProgram("/nonexistent/m.pt2", 1, warnings);
  ASSERT_FALSE(bool(graph));
  EXPECT_NE(llvm::toString(graph.takeError())
                .find("/nonexistent/m.pt2: cannot read: "),
            std::string::npos);
}

TEST(ExportedProgramImport, WrongJsonTypesNameTheNodeOrTensorAndPath) {
  struct Case {
    std::function<void(json &)> plant;
    const char *message;
  };
  const Case cases[] = {
      {[](json &p) { p["graph_module"]["graph"]["nodes"][0]["name"] = 5; },
       "p.json: node #0: /graph_module/graph/nodes/0/name: expected a string, "
       "got 5"},
      {[](json &p) { p["graph_module"]["graph"]["nodes"][0].erase("target"); },
       "p.json: node 'y': /graph_module/graph/nodes/0/target: expected a "
       "string (the op, e.g. torch.ops.aten.linear.default), got null"},
      {[](json &p) {
         p["graph_module"]["graph"]["tensor_values"]["w"]["requires_grad"] =
             "yes";
       },
       "p.json: tensor 'w': /graph_module/graph/tensor_values/w/"
       "requires_grad: expected true or false, got \"yes\""},
      {[](json &p) {
         p["graph_module"]["graph"]["tensor_values"]["x"]["sizes"] =
             json::object({{"a", 1}});
       },
       "p.json: tensor 'x': /graph_module/graph/tensor_values/x/sizes: "
       "expected an array, got {...}"},
      {[](json &p) {
         p["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][1] = "4";
       },
       "p.json: tensor 'x': /graph_module/graph/tensor_values/x/sizes/1: "
       "expected a size {\"as_int\": N} or {\"as_expr\": ...}, got \"4\""},
      {[](json &p) {
         p["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0] = {
             {"as_expr", {{"expr_str", 5}}}};
       },
       "p.json: tensor 'x': symbolic size '?' has no example value"},
      {[](json &p) { p["schema_version"] = {{"major", 3}, {"minor", "x"}}; },
       "p.json: /schema_version: schema version 3.0 is not supported"},
      {[](json &p) {
         p["graph_module"]["graph"]["nodes"][0]["metadata"]["nn_module_stack"] =
             7;
       },
       "p.json: node 'y' (torch.ops.aten.linear.default): "
       "/graph_module/graph/nodes/0/metadata/nn_module_stack: expected a "
       "string \"KEY,FQN,TYPE;...\", got 7"},
      {[](json &p) {
         p["graph_module"]["graph"]["nodes"][0]["inputs"][0]["arg"] = {
             {"as_tensors", 3}};
       },
       "p.json: node 'y' (torch.ops.aten.linear.default): "
       "/graph_module/graph/nodes/0/inputs/0/arg/as_tensors: expected an "
       "array, got 3"},
      {[](json &p) { p["graph_module"]["graph"]["nodes"][0]["inputs"][1] = 2; },
       "p.json: node 'y' (torch.ops.aten.linear.default): "
       "/graph_module/graph/nodes/0/inputs/1: expected an input {\"name\", "
       "\"arg\"}, got 2"},
  };
  for (const Case &c : cases) {
    json p = program();
    c.plant(p);
    std::string err = programError(p);
    EXPECT_NE(err.find(c.message), std::string::npos) << err;
    EXPECT_EQ(err.find("json.exception"), std::string::npos) << err;
  }
}

TEST(ExportedProgramImport, RankIsBounded) {
  auto withRank = [](int rank) {
    json p = program();
    json &x = p["graph_module"]["graph"]["tensor_values"]["x"];
    x["sizes"] = json::array();
    x["strides"] = json::array();
    for (int d = 0; d < rank; ++d) {
      x["sizes"].push_back({{"as_int", 1}});
      x["strides"].push_back({{"as_int", 1}});
    }
    return p;
  };
  std::string err = programError(withRank(200000));
  EXPECT_NE(err.find("p.json: tensor 'x': 200000 dimensions, more than the 64 "
                     "this importer reads"),
            std::string::npos)
      << err;
  err = programError(withRank(64));
  EXPECT_EQ(err.find("dimensions"), std::string::npos) << err;
}

// Ops whose cost the rules cannot know are refused, not counted 0.
TEST(ExportedProgramImport, ControlFlowAndCustomOpsAreErrors) {
  json p = program();
  p["graph_module"]["graph"]["nodes"][1]["target"] =
      "torch.ops.higher_order.cond";
  EXPECT_NE(
      programError(p).find("p.json: node 'z' (torch.ops.higher_order.cond): "
                           "higher-order op 'cond' (torch.cond, while_loop, "
                           "...): its body is a subgraph this importer "
                           "cannot price"),
      std::string::npos)
      << programError(p);
  p["graph_module"]["graph"]["nodes"][1]["target"] =
      "torch.ops.mylib.fused.default";
  EXPECT_NE(
      programError(p).find("p.json: node 'z' (torch.ops.mylib.fused.default): "
                           "custom op 'mylib::fused' has no cost rule"),
      std::string::npos)
      << programError(p);
}

// A region is one call of one module: a second call is refused, adjacent
// (torch.export's `@1`) or after other code.
TEST(ExportedProgramImport, RepeatedRegionCallIsAnError) {
  json p = program();
  p["graph_module"]["graph"]["nodes"][2]["metadata"]["nn_module_stack"] =
      "L__self__,,M;L__self__layers.0@1,layers.0@1,Block";
  EXPECT_NE(
      programError(p).find("p.json: node 'loss' (torch.ops.aten.sum.default): "
                           "module 'layers.0' is called more than once"),
      std::string::npos)
      << programError(p);
  // As torch 2.13 writes it: the suffix on the key only.
  p = program();
  p["graph_module"]["graph"]["nodes"][2]["metadata"]["nn_module_stack"] =
      "L__self__,,M;L__self__layers.0@1,layers.0,Block";
  EXPECT_NE(
      programError(p).find("p.json: node 'loss' (torch.ops.aten.sum.default): "
                           "module 'layers.0' is called more than once"),
      std::string::npos)
      << programError(p);
  p = program();
  p["graph_module"]["graph"]["nodes"][1]["metadata"]["nn_module_stack"] =
      "L__self__,,M";
  p["graph_module"]["graph"]["nodes"][2]["metadata"]["nn_module_stack"] =
      "L__self__,,M;L__self__layers.0,layers.0,Block";
  EXPECT_NE(
      programError(p).find("p.json: node 'loss' (torch.ops.aten.sum.default): "
                           "module 'layers.0' is called more than once"),
      std::string::npos)
      << programError(p);
}

//===----------------------------------------------------------------------===//
// Archives
//===----------------------------------------------------------------------===//

struct Entry {
  std::string name;
  std::string bytes;
  bool deflate = false;
};

std::string readAll(const std::string &path) {
  auto buffer = llvm::MemoryBuffer::getFile(path);
  return buffer ? (*buffer)->getBuffer().str() : "";
}

void writeAll(const std::string &path, llvm::StringRef bytes) {
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec);
  ASSERT_FALSE(ec);
  os << bytes;
}

/// A new zip file of \p entries, written by minizip.
std::string writeZip(const std::vector<Entry> &entries) {
  std::string path = mlir::hpr::test::newScratchDir() + "/archive.pt2";
  zipFile archive = zipOpen64(path.c_str(), APPEND_STATUS_CREATE);
  EXPECT_NE(archive, nullptr) << path;
  for (const Entry &entry : entries) {
    zip_fileinfo info = {};
    EXPECT_EQ(zipOpenNewFileInZip64(
                  archive, entry.name.c_str(), &info, nullptr, 0, nullptr, 0,
                  nullptr, entry.deflate ? Z_DEFLATED : 0,
                  entry.deflate ? Z_DEFAULT_COMPRESSION : 0, /*zip64=*/0),
              ZIP_OK);
    EXPECT_EQ(zipWriteInFileInZip(archive, entry.bytes.data(),
                                  unsigned(entry.bytes.size())),
              ZIP_OK);
    EXPECT_EQ(zipCloseFileInZip(archive), ZIP_OK);
  }
  EXPECT_EQ(zipClose(archive, nullptr), ZIP_OK);
  return path;
}

/// Makes the first entry's local header and the central directory both claim
/// \p size inflated bytes (the directory still agrees with itself).
void claimSize(const std::string &path, uint32_t size) {
  std::string bytes = readAll(path);
  size_t local = bytes.find("PK\x03\x04"), central = bytes.find("PK\x01\x02");
  ASSERT_EQ(local, 0u);
  ASSERT_NE(central, std::string::npos);
  for (size_t at : {local + 22, central + 24})
    for (int i = 0; i < 4; ++i)
      bytes[at + i] = char((size >> (8 * i)) & 0xFF);
  writeAll(path, bytes);
}

std::string importError(const std::string &path) {
  std::vector<std::string> warnings;
  auto graph = importExportedProgram(path, 1, warnings);
  if (graph)
    return "<no error>";
  return llvm::toString(graph.takeError());
}

const char *kProgramEntry = "archive/models/model.json";

TEST(ExportedProgramImport, ArchiveThatImports) {
  std::string path = writeZip({{kProgramEntry, program().dump(), true}});
  EXPECT_EQ(importError(path), "<no error>");
}

TEST(ExportedProgramImport, EmptyFileIsNotAnArchive) {
  std::string path = mlir::hpr::test::newScratchDir() + "/empty.pt2";
  writeAll(path, "");
  EXPECT_NE(importError(path).find(
                ": not a valid torch.export archive (the file is "
                "empty); expected a file written by torch.export.save"),
            std::string::npos)
      << importError(path);
}

TEST(ExportedProgramImport, DuplicateEntryIsNamed) {
  std::string path =
      writeZip({{kProgramEntry, program().dump()},
                {"archive/models/modelXjson", program().dump()}});
  std::string bytes = readAll(path);
  for (size_t at; (at = bytes.find("modelXjson")) != std::string::npos;)
    bytes.replace(at, 10, "model.json");
  writeAll(path, bytes);
  EXPECT_NE(importError(path).find(
                ": not a valid torch.export archive (duplicate entry "
                "archive/models/model.json in the archive)"),
            std::string::npos)
      << importError(path);
}

// A small archive cannot make the reader allocate much (ZipArchive.h).
TEST(ExportedProgramImport, InflatedSizeIsBounded) {
  // A 3 MiB program of mostly blanks deflates about 1000:1.
  std::string padded = program().dump() + std::string(3 << 20, ' ');
  std::string path = writeZip({{kProgramEntry, padded, true}});
  EXPECT_NE(
      importError(path).find("entry 'archive/models/model.json' inflates "),
      std::string::npos)
      << importError(path);
  EXPECT_NE(importError(path).find(
                "more than 100 times; refused as a likely zip bomb"),
            std::string::npos)
      << importError(path);

  // A directory that claims more than all reads may inflate: refused before
  // any byte is inflated.
  path = writeZip({{kProgramEntry, program().dump(), true}});
  claimSize(path, uint32_t(300) << 20);
  EXPECT_NE(importError(path).find(
                "entry 'archive/models/model.json' is 314572800 bytes, more "
                "than the 268435456 left of the 268435456 this reader "
                "inflates from one archive"),
            std::string::npos)
      << importError(path);
}

TEST(ExportedProgramImport, LyingDirectorySizeAllocatesNothingFromIt) {
  // 4 MiB that do not compress, claimed as 200 MiB (a ratio of 50, allowed).
  std::string noise(4 << 20, '\0');
  uint64_t state = 1;
  for (char &c : noise) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    c = char(state >> 56);
  }
  std::string path = writeZip({{kProgramEntry, noise, true}});
  claimSize(path, uint32_t(200) << 20);
  rusage before, after;
  getrusage(RUSAGE_SELF, &before);
  std::string err = importError(path);
  getrusage(RUSAGE_SELF, &after);
  EXPECT_NE(err.find("entry 'archive/models/model.json' is damaged"),
            std::string::npos)
      << err;
  // ru_maxrss is in KiB: the peak grew by far less than the claim (ctest
  // runs each test in a process of its own, so the peak before is small).
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 64 << 10);
}

// Each case as torch decided it: torch.empty(N).as_strided(sizes,
// strides).view(shape) succeeds or raises.
TEST(RegionCosts, ViewRuleMatchesTorch) {
  using mlir::hpr::model::detail::isViewable;
  EXPECT_TRUE(isViewable({2, 3, 4}, {12, 4, 1}, {6, 4}));
  EXPECT_FALSE(isViewable({2, 3}, {1, 2}, {6}));
  EXPECT_TRUE(isViewable({4, 2, 3}, {0, 3, 1}, {4, 6}));
  EXPECT_FALSE(isViewable({4, 2, 3}, {0, 3, 1}, {24}));
  EXPECT_TRUE(isViewable({4, 40, 4, 12}, {1920, 48, 12, 1}, {4, 40, 48}));
  EXPECT_FALSE(isViewable({4, 4, 40, 12}, {1920, 12, 48, 1}, {4, 160, 12}));
  EXPECT_FALSE(isViewable({4, 40, 4, 12}, {1920, 12, 480, 1}, {4, 40, 48}));
  EXPECT_TRUE(isViewable({1, 5}, {99, 1}, {5}));
  EXPECT_TRUE(isViewable({3, 1, 2}, {2, 7, 1}, {6}));
}

} // namespace
