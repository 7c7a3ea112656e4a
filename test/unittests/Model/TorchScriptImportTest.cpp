//===- TorchScriptImportTest.cpp - Tests for the TorchScript importer -----===//
//
// The bundled examples' sidecars (written by the Python exporter, which
// measures saved tensors with autograd hooks on the eager model) are the
// independent reference for the importer's per-op rules.
//
//===----------------------------------------------------------------------===//

#include "hpr/Model/TorchScriptImport.h"
#include "hpr/Model/ModelFile.h"

#include "Scratch.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include "gtest/gtest.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>

using namespace mlir::hpr::model;

namespace {

std::string source(llvm::StringRef rel) {
  return (llvm::Twine(HPR_SOURCE_DIR) + "/" + rel).str();
}

/// A fresh directory holding a copy of \p file (so no sidecar sits beside it).
std::string copyAlone(llvm::StringRef file) {
  llvm::SmallString<128> dest(mlir::hpr::test::newScratchDir());
  llvm::sys::path::append(dest, llvm::sys::path::filename(file));
  EXPECT_FALSE(llvm::sys::fs::copy_file(file, dest));
  return dest.str().str();
}

std::string writeTemp(llvm::StringRef name, llvm::StringRef bytes) {
  llvm::SmallString<128> dest(mlir::hpr::test::newScratchDir());
  llvm::sys::path::append(dest, name);
  std::error_code ec;
  llvm::raw_fd_ostream os(dest, ec);
  os << bytes;
  return dest.str().str();
}

struct SidecarRegion {
  std::string name;
  bool checkpointable;
  int64_t savedBytes;
  double flops;
};

std::vector<SidecarRegion> readSidecar(llvm::StringRef path) {
  std::ifstream in(path.str());
  nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<SidecarRegion> regions;
  for (const auto &r : doc["regions"])
    regions.push_back(
        {r["name"], r["checkpointable"], r["saved_bytes"], r["fwd_flops"]});
  return regions;
}

struct Example {
  const char *name;   // examples/NAME/NAME.pt
  const char *prefix; // region name prefix of the repeated blocks
  int blocks;         // number of those blocks
  const char *shape;  // --input-shape
  const char *dtype;  // --input-dtype
};

class BundledExample : public ::testing::TestWithParam<Example> {};

void checkAgainstSidecar(const Example &ex, const ModelGraph &graph) {
  auto sidecar = readSidecar(
      source(std::string("examples/") + ex.name + "/" + ex.name + ".json"));
  std::map<std::string, const Region *> byName;
  int blocks = 0;
  for (const Region &region : graph.regions) {
    byName[region.name] = &region;
    if (region.checkpointable) {
      EXPECT_EQ(region.name, std::string(ex.prefix) + std::to_string(blocks));
      ++blocks;
    }
  }
  EXPECT_EQ(blocks, ex.blocks);
  for (const SidecarRegion &ref : sidecar) {
    if (!ref.checkpointable)
      continue;
    ASSERT_TRUE(byName.count(ref.name)) << ref.name;
    const Region &got = *byName[ref.name];
    EXPECT_NEAR(double(got.savedBytes), double(ref.savedBytes),
                0.10 * double(ref.savedBytes))
        << ex.name << " " << ref.name;
    EXPECT_NEAR(got.fwdFlops, ref.flops, 0.10 * ref.flops)
        << ex.name << " " << ref.name;
    EXPECT_GT(got.inputBytes, 0);
    EXPECT_GT(got.paramBytes, 0);
  }
}

TEST_P(BundledExample, PtMatchesMeasuredSavedBytes) {
  const Example &ex = GetParam();
  std::string pt = copyAlone(
      source(std::string("examples/") + ex.name + "/" + ex.name + ".pt"));
  TorchScriptOptions options;
  auto shapes = parseShapeList(ex.shape);
  ASSERT_TRUE(bool(shapes));
  options.inputShapes = *shapes;
  options.inputDtype = ex.dtype;
  std::vector<std::string> warnings;
  auto graph = importTorchScript(pt, options, &warnings);
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  EXPECT_EQ(graph->name, ex.name);
  for (const std::string &w : warnings)
    ADD_FAILURE() << "unexpected warning: " << w;
  for (const Region &region : graph->regions)
    EXPECT_FALSE(region.checkpoint);
  EXPECT_FALSE(graph->regions.front().checkpointable);
  EXPECT_FALSE(graph->regions.back().checkpointable);
  checkAgainstSidecar(ex, *graph);
}

TEST_P(BundledExample, IrTextMatchesMeasuredSavedBytes) {
  const Example &ex = GetParam();
  std::string ir = copyAlone(
      source(std::string("examples/") + ex.name + "/" + ex.name + ".ir"));
  std::vector<std::string> warnings;
  auto graph = importTorchScript(ir, TorchScriptOptions(), &warnings);
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  checkAgainstSidecar(ex, *graph);
}

TEST_P(BundledExample, SidecarProvidesShapesAndSavedBytes) {
  const Example &ex = GetParam();
  std::string pt =
      source(std::string("examples/") + ex.name + "/" + ex.name + ".pt");
  auto graph = readModelFile(pt, TorchScriptOptions());
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  auto sidecar = readSidecar(
      source(std::string("examples/") + ex.name + "/" + ex.name + ".json"));
  ASSERT_EQ(graph->regions.size(), sidecar.size());
  for (size_t i = 0; i < sidecar.size(); ++i) {
    EXPECT_EQ(graph->regions[i].name, sidecar[i].name);
    EXPECT_EQ(graph->regions[i].savedBytes, sidecar[i].savedBytes);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Examples, BundledExample,
    ::testing::Values(Example{"gpt", "blocks.", 8, "4x40", "int64"},
                      Example{"mlp", "layers.", 16, "8x32", "float32"},
                      Example{"cnn", "stages.", 4, "4x3x16x16", "float32"}),
    [](const auto &info) { return std::string(info.param.name); });

TEST(TorchScriptImport, HandWrittenIrCostsAndWarning) {
  std::vector<std::string> warnings;
  std::string path = source("test/inputs/models/two_layers.ir");
  auto graph = importTorchScript(path, TorchScriptOptions(), &warnings);
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  ASSERT_EQ(graph->regions.size(), 3u);
  const Region &l0 = graph->regions[0], &l1 = graph->regions[1],
               &head = graph->regions[2];
  EXPECT_EQ(l0.name, "layers.0");
  EXPECT_EQ(l1.name, "layers.1");
  EXPECT_EQ(head.name, "head");
  EXPECT_FALSE(head.checkpointable);
  // mm 4x8 @ 8x16 = 2*4*8*16 FLOPs; saves x (128 B); relu saves its result
  // (4x16 floats = 256 B) and costs 64.
  EXPECT_DOUBLE_EQ(l0.fwdFlops, 1024 + 64);
  EXPECT_EQ(l0.savedBytes, 128 + 256);
  EXPECT_EQ(l0.inputBytes, 128);
  EXPECT_EQ(l0.paramBytes, 8 * 16 * 4);
  // mm 4x16 @ 16x8 saves a (256 B); logcumsumexp has no rule: 0 and a warning.
  EXPECT_DOUBLE_EQ(l1.fwdFlops, 1024);
  EXPECT_EQ(l1.savedBytes, 256);
  EXPECT_EQ(l1.inputBytes, 256);
  EXPECT_EQ(l1.paramBytes, 16 * 8 * 4);
  // tanh keeps its 4x8 result.
  EXPECT_EQ(head.savedBytes, 128);
  EXPECT_DOUBLE_EQ(head.fwdFlops, 32);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("two_layers.ir:9:1: warning: no cost rule for "
                             "'aten::logcumsumexp'"),
            std::string::npos)
      << warnings[0];
}

TEST(TorchScriptImport, IrInputShapeOverride) {
  TorchScriptOptions options;
  options.inputShapes = {{10, 8}};
  std::vector<std::string> warnings;
  auto graph = importTorchScript(source("test/inputs/models/two_layers.ir"),
                                 options, &warnings);
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  EXPECT_DOUBLE_EQ(graph->regions[0].fwdFlops, 2.0 * 10 * 8 * 16 + 10 * 16);
}

TEST(TorchScriptImport, ProfileRecordsTime) {
  auto graph = importTorchScript(copyAlone(source("examples/mlp/mlp.pt")), [] {
    TorchScriptOptions o;
    o.profile = true;
    o.inputShapes = {{8, 32}};
    return o;
  }());
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  for (const Region &region : graph->regions)
    EXPECT_GT(region.fwdTimeUs, 0) << region.name;
}

std::string errorOf(llvm::StringRef path, TorchScriptOptions options = {}) {
  std::vector<std::string> warnings;
  auto graph = readModelFile(path, options, &warnings);
  if (graph)
    return "<no error>";
  return llvm::toString(graph.takeError());
}

TEST(TorchScriptImport, TruncatedArchive) {
  auto buffer = llvm::MemoryBuffer::getFile(source("examples/gpt/gpt.pt"));
  ASSERT_TRUE(bool(buffer));
  llvm::StringRef bytes = (*buffer)->getBuffer();
  std::string path = writeTemp("cut.pt", bytes.take_front(bytes.size() / 2));
  std::string err = errorOf(path);
  EXPECT_NE(err.find("cut.pt:1:1: not a valid TorchScript archive"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST(TorchScriptImport, CorruptArchive) {
  // A zip-looking header followed by garbage.
  std::string path = writeTemp("junk.pt", std::string("PK\x03\x04", 4) +
                                              std::string(500, 'z'));
  std::string err = errorOf(path);
  EXPECT_NE(err.find("junk.pt:1:1: not a valid TorchScript archive"),
            std::string::npos)
      << err;
  path = writeTemp("text.pt", "this is not a model\n");
  err = errorOf(path);
  EXPECT_NE(err.find("text.pt:1:1: not a valid TorchScript archive (no zip "
                     "header)"),
            std::string::npos)
      << err;
  // A well-formed zip whose contents are not TorchScript: LibTorch throws.
  auto buffer = llvm::MemoryBuffer::getFile(source("examples/mlp/mlp.pt"));
  ASSERT_TRUE(bool(buffer));
  std::string bytes = (*buffer)->getBuffer().str();
  // Flip bytes in the middle of the stored data (CRC errors on read).
  for (size_t i = bytes.size() / 3; i < bytes.size() / 3 + 64; ++i)
    bytes[i] = char(bytes[i] ^ 0x5a);
  path = writeTemp("flipped.pt", bytes);
  err = errorOf(path);
  EXPECT_EQ(err.rfind(path, 0), 0u) << err;
}

TEST(TorchScriptImport, IrSyntaxError) {
  std::string err = errorOf(source("test/inputs/models/syntax_error.ir"));
  EXPECT_NE(err.find("syntax_error.ir:3:"), std::string::npos) << err;
  EXPECT_NE(err.find("invalid TorchScript IR"), std::string::npos) << err;
}

TEST(TorchScriptImport, NoRegions) {
  TorchScriptOptions options;
  options.regionDepth = 2;
  options.inputShapes = {{8, 32}};
  std::string err = errorOf(copyAlone(source("examples/mlp/mlp.pt")), options);
  EXPECT_NE(err.find("mlp.pt: no regions at region depth 2"), std::string::npos)
      << err;
  EXPECT_NE(err.find("layers.3"), std::string::npos) << err;
}

TEST(TorchScriptImport, RegionDepthZeroUsesTopLevelCalls) {
  auto graph = readModelFile(copyAlone(source("examples/cnn/cnn.pt")), [] {
    TorchScriptOptions o;
    o.regionDepth = 0;
    o.inputShapes = {{4, 3, 16, 16}};
    return o;
  }());
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  EXPECT_EQ(graph->regions.front().name, "stem");
  EXPECT_TRUE(graph->regions.front().checkpointable);
}

TEST(TorchScriptImport, WrongInputs) {
  TorchScriptOptions options;
  options.inputShapes = {{4, 40}, {4, 40}};
  options.inputDtype = "int64";
  std::string err = errorOf(copyAlone(source("examples/gpt/gpt.pt")), options);
  EXPECT_NE(err.find("forward takes 1 tensor inputs but 2 shapes were given"),
            std::string::npos)
      << err;
  // No shapes at all and no sidecar.
  err = errorOf(copyAlone(source("examples/gpt/gpt.pt")));
  EXPECT_NE(err.find("but 0 shapes were given"), std::string::npos) << err;
  // A shape the model cannot run with: located at the failing op.
  options.inputShapes = {{4, 40, 3}};
  options.inputDtype = "float32";
  err = errorOf(copyAlone(source("examples/gpt/gpt.pt")), options);
  EXPECT_NE(err.find("cannot run"), std::string::npos) << err;
  options.inputShapes = {{4, 40}};
  options.inputDtype = "complex";
  err = errorOf(copyAlone(source("examples/gpt/gpt.pt")), options);
  EXPECT_NE(err.find("--input-dtype:1:1: expected a dtype"), std::string::npos)
      << err;
}

TEST(TorchScriptImport, UnknownExtensionAndMissingFile) {
  EXPECT_NE(errorOf("model.onnx").find("model.onnx: unknown model format"),
            std::string::npos);
  EXPECT_NE(errorOf("/nonexistent/m.pt").find("/nonexistent/m.pt: cannot read"),
            std::string::npos);
}

TEST(ModelFile, ReadsJsonGraph) {
  auto graph = readModelFile(source("examples/gpt/gpt.model.json"),
                             TorchScriptOptions());
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  EXPECT_EQ(graph->name, "gpt");
  int blocks = 0;
  for (const Region &region : graph->regions)
    blocks += region.checkpointable;
  EXPECT_EQ(blocks, 8);
}

TEST(ShapeList, Parses) {
  auto shapes = parseShapeList("4x40x48,4x40");
  ASSERT_TRUE(bool(shapes));
  ASSERT_EQ(shapes->size(), 2u);
  EXPECT_EQ((*shapes)[0], (std::vector<int64_t>{4, 40, 48}));
  EXPECT_EQ((*shapes)[1], (std::vector<int64_t>{4, 40}));
}

TEST(ShapeList, Errors) {
  auto check = [](llvm::StringRef text, llvm::StringRef expected) {
    auto shapes = parseShapeList(text);
    ASSERT_FALSE(bool(shapes)) << text.str();
    std::string err = llvm::toString(shapes.takeError());
    EXPECT_NE(err.find(expected.str()), std::string::npos) << err;
  };
  check("4xx3", "--input-shape:1:3: expected a positive integer dimension in "
                "shape '4xx3', got ''");
  check("4x40,4xa", "--input-shape:1:8: expected a positive integer dimension "
                    "in shape '4xa', got 'a'");
  check("4x0", "--input-shape:1:3:");
  check("4x40,", "--input-shape:1:6:");
  check("", "--input-shape:1:1:");
  check("-4", "--input-shape:1:1:");
}

} // namespace
