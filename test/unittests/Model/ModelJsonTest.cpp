//===- ModelJsonTest.cpp - Tests for the model JSON graph format ----------===//

#include "hpr/Model/ModelJson.h"

#include "gtest/gtest.h"

using namespace mlir::hpr::model;

namespace {

const char *kGood = R"({
  "format": "hp-recompute-model", "version": 1, "name": "tiny",
  "regions": [
    {"name": "embed", "checkpointable": false, "fwd_flops": 10,
     "saved_bytes": 8, "input_bytes": 4, "param_bytes": 100, "stage": 0},
    {"name": "layers.0", "checkpoint": true, "fwd_flops": 2.5e6,
     "fwd_time_us": 12.5, "saved_bytes": 4096, "input_bytes": 512,
     "param_bytes": 1024, "stage": 0},
    {"name": "layers.1", "fwd_flops": 3, "saved_bytes": 1, "input_bytes": 2,
     "param_bytes": 3}
  ]
})";

std::string modelJsonError(llvm::StringRef text) {
  auto graph = parseModelJson(text, "m.json");
  if (graph)
    return "<no error>";
  return llvm::toString(graph.takeError());
}

TEST(ModelJson, ParsesAllFields) {
  auto graph = parseModelJson(kGood, "m.json");
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  EXPECT_EQ(graph->name, "tiny");
  ASSERT_EQ(graph->regions.size(), 3u);
  const Region &embed = graph->regions[0], &l0 = graph->regions[1],
               &l1 = graph->regions[2];
  EXPECT_EQ(embed.name, "embed");
  EXPECT_FALSE(embed.checkpointable);
  EXPECT_FALSE(embed.checkpoint);
  EXPECT_EQ(embed.stage, 0);
  EXPECT_TRUE(l0.checkpoint);
  EXPECT_DOUBLE_EQ(l0.fwdFlops, 2.5e6);
  EXPECT_DOUBLE_EQ(l0.fwdTimeUs, 12.5);
  EXPECT_EQ(l0.savedBytes, 4096);
  EXPECT_EQ(l0.inputBytes, 512);
  EXPECT_EQ(l0.paramBytes, 1024);
  EXPECT_TRUE(l1.checkpointable);
  EXPECT_EQ(l1.stage, -1);
  EXPECT_DOUBLE_EQ(l1.fwdTimeUs, 0);
}

TEST(ModelJson, PrintRoundTrips) {
  auto graph = parseModelJson(kGood, "m.json");
  ASSERT_TRUE(bool(graph));
  std::string printed = printModelJson(*graph);
  auto again = parseModelJson(printed, "printed.json");
  ASSERT_TRUE(bool(again)) << llvm::toString(again.takeError());
  ASSERT_EQ(again->regions.size(), graph->regions.size());
  for (size_t i = 0; i < graph->regions.size(); ++i) {
    const Region &a = graph->regions[i], &b = again->regions[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.checkpoint, b.checkpoint);
    EXPECT_EQ(a.checkpointable, b.checkpointable);
    EXPECT_DOUBLE_EQ(a.fwdFlops, b.fwdFlops);
    EXPECT_DOUBLE_EQ(a.fwdTimeUs, b.fwdTimeUs);
    EXPECT_EQ(a.savedBytes, b.savedBytes);
    EXPECT_EQ(a.inputBytes, b.inputBytes);
    EXPECT_EQ(a.paramBytes, b.paramBytes);
    EXPECT_EQ(a.stage, b.stage);
  }
  EXPECT_NE(printed.find("\"format\": \"hp-recompute-model\""),
            std::string::npos);
}

TEST(ModelJson, MeasuredCostsRoundTrip) {
  auto graph = parseModelJson(R"({"name": "m", "regions": [
    {"name": "l0", "fwd_flops": 1, "saved_bytes": 8, "input_bytes": 8,
     "param_bytes": 8, "bwd_input_time_us": 2.5, "bwd_weight_time_us": 3,
     "bwd_time_us": 4.5, "checkpoint_fwd_time_us": 1.5,
     "replay_time_us": 1.25, "bwd_weight_input_bytes": 96,
     "bwd_workspace_bytes": 640},
    {"name": "l1", "fwd_flops": 1, "saved_bytes": 8, "input_bytes": 8,
     "param_bytes": 8}]})",
                              "m.json");
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  const Region &measured = graph->regions[0];
  EXPECT_DOUBLE_EQ(measured.bwdInputTimeUs, 2.5);
  EXPECT_DOUBLE_EQ(measured.replayTimeUs, 1.25);
  EXPECT_EQ(measured.bwdWorkspaceBytes, 640);
  std::string printed = printModelJson(*graph);
  auto again = parseModelJson(printed, "printed.json");
  ASSERT_TRUE(bool(again)) << llvm::toString(again.takeError());
  for (size_t i = 0; i < 2; ++i) {
    for (const MeasuredTime &time : kMeasuredTimes)
      EXPECT_DOUBLE_EQ(graph->regions[i].*time.field,
                       again->regions[i].*time.field)
          << time.key;
    for (const MeasuredBytes &bytes : kMeasuredBytes)
      EXPECT_EQ(graph->regions[i].*bytes.field, again->regions[i].*bytes.field)
          << bytes.key;
  }
  // Unmeasured costs stay out of the printed file.
  EXPECT_EQ(printed.find("bwd_time_us"), printed.rfind("bwd_time_us"));
}

TEST(ModelJson, SelectivePolicyRoundTrips) {
  auto graph = parseModelJson(R"({"name": "m", "regions": [
    {"name": "l0", "checkpoint": "selective", "fwd_flops": 1,
     "saved_bytes": 8, "input_bytes": 8, "param_bytes": 8,
     "selective_fwd_time_us": 2.5, "selective_replay_time_us": 0.5,
     "selective_saved_bytes": 96, "selective_replay_bytes": 40},
    {"name": "l1", "checkpoint": true, "fwd_flops": 1, "saved_bytes": 8,
     "input_bytes": 8, "param_bytes": 8}]})",
                              "m.json");
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  const Region &selective = graph->regions[0], &full = graph->regions[1];
  EXPECT_TRUE(selective.checkpoint && selective.selective);
  EXPECT_TRUE(full.checkpoint && !full.selective);
  EXPECT_DOUBLE_EQ(selective.selectiveReplayTimeUs, 0.5);
  EXPECT_EQ(selective.selectiveSavedBytes, 96);
  std::string printed = printModelJson(*graph);
  EXPECT_NE(printed.find("\"checkpoint\": \"selective\""), std::string::npos);
  auto again = parseModelJson(printed, "printed.json");
  ASSERT_TRUE(bool(again)) << llvm::toString(again.takeError());
  EXPECT_TRUE(again->regions[0].selective);
  EXPECT_FALSE(again->regions[1].selective);
  EXPECT_TRUE(again->regions[1].checkpoint);
  EXPECT_EQ(again->regions[0].selectiveReplayBytes, 40);
}

TEST(ModelJson, SyntaxErrorHasRowAndColumn) {
  std::string err =
      modelJsonError("{\n  \"name\": \"x\",\n  \"regions\": [}\n");
  EXPECT_EQ(err.rfind("m.json:3:", 0), 0u) << err;
  EXPECT_NE(err.find("invalid JSON"), std::string::npos) << err;
}

// The JSON reader all file formats share (lib/Support/Json.cpp), through
// the model reader.
TEST(ModelJson, SyntaxErrorIsLocatedOnce) {
  std::string err = modelJsonError("{\n  \"name\": ,\n}");
  EXPECT_EQ(err.rfind("m.json:2:11: invalid JSON: syntax error", 0), 0u) << err;
  EXPECT_EQ(err.find("line"), std::string::npos) << err;
  EXPECT_EQ(err.find("column"), std::string::npos) << err;
}

TEST(ModelJson, TextAfterANulByteIsAnError) {
  // Valid JSON up to the NUL: nlohmann's lexer takes the NUL for the end.
  std::string text = std::string(kGood) + std::string("\0{\"x\"", 6);
  std::string err = modelJsonError(text);
  EXPECT_EQ(err.rfind("m.json:12:2: invalid JSON: a NUL byte", 0), 0u) << err;
  // Inside a string, too.
  text = std::string("{\"name\": \"a\0b\"}", 16);
  err = modelJsonError(text);
  EXPECT_EQ(err.rfind("m.json:1:12: invalid JSON: a NUL byte", 0), 0u) << err;
}

TEST(ModelJson, HugeNumbersAreLocatedErrors) {
  std::string digits(5000, '7');
  std::string err =
      modelJsonError("{\"name\": \"m\",\n \"regions\": " + digits + "}");
  EXPECT_EQ(err.rfind("m.json:2:13: invalid JSON: number overflow: "
                      "'77777777777777777777...' (5000 characters)",
                      0),
            0u)
      << err;
  err = modelJsonError("[1, -2e400]");
  EXPECT_EQ(err.rfind("m.json:1:5: invalid JSON: number overflow: '-2e400'", 0),
            0u)
      << err;
  // Large but finite numbers and escaped quotes are no error of the JSON.
  EXPECT_EQ(modelJsonError("[\"\\\"[[[\", 1e300, 12345678901234567890123]")
                .find("invalid JSON"),
            std::string::npos);
}

TEST(ModelJson, DeepNestingIsLocated) {
  std::string err =
      modelJsonError(std::string(100, '[') + std::string(100, ']'));
  EXPECT_EQ(
      err.rfind("m.json:1:65: invalid JSON: nested deeper than 64 levels", 0),
      0u)
      << err;
}

TEST(ModelJson, DataParallelRoundTrips) {
  auto graph = parseModelJson(
      R"({"name": "m", "data_parallel": {"shard": 4, "replicate": 2},
          "regions": [{"name": "a", "fwd_flops": 1, "saved_bytes": 1,
                       "input_bytes": 1, "param_bytes": 1}]})",
      "m.json");
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  EXPECT_EQ(graph->dataParallel.shard, 4);
  EXPECT_EQ(graph->dataParallel.replicate, 2);
  auto again = parseModelJson(printModelJson(*graph), "printed.json");
  ASSERT_TRUE(bool(again)) << llvm::toString(again.takeError());
  EXPECT_EQ(again->dataParallel.shard, 4);
  EXPECT_EQ(again->dataParallel.replicate, 2);
  // Absent: 1 x 1, and printed without the member.
  auto plain = parseModelJson(kGood, "m.json");
  ASSERT_TRUE(bool(plain)) << llvm::toString(plain.takeError());
  EXPECT_EQ(plain->dataParallel.shard, 1);
  EXPECT_EQ(printModelJson(*plain).find("data_parallel"), std::string::npos);
}

struct Violation {
  const char *doc;
  const char *message; // expected substring (path + expectation)
};

class ModelJsonViolation : public ::testing::TestWithParam<Violation> {};

TEST_P(ModelJsonViolation, NamesThePath) {
  std::string err = modelJsonError(GetParam().doc);
  EXPECT_EQ(err.rfind("m.json: ", 0), 0u) << err;
  EXPECT_NE(err.find(GetParam().message), std::string::npos) << err;
}

#define REGION(extra)                                                          \
  "{\"name\": \"m\", \"regions\": [{\"name\": \"a\", \"fwd_flops\": 1, "       \
  "\"saved_bytes\": 1, \"input_bytes\": 1, \"param_bytes\": 1" extra "}]}"

// Two regions of 10 parameter bytes each, listing `first` and `second` as
// their tied_params.
#define TIED(first, second)                                                    \
  "{\"name\": \"m\", \"regions\": [{\"name\": \"a\", \"fwd_flops\": 1, "       \
  "\"saved_bytes\": 1, \"input_bytes\": 1, \"param_bytes\": 10, "              \
  "\"tied_params\": " first "}, {\"name\": \"b\", \"fwd_flops\": 1, "          \
  "\"saved_bytes\": 1, \"input_bytes\": 1, \"param_bytes\": 10, "              \
  "\"tied_params\": " second "}]}"
#define W4 "[{\"name\": \"w\", \"bytes\": 4}]"

INSTANTIATE_TEST_SUITE_P(
    TiedParams, ModelJsonViolation,
    ::testing::Values(
        Violation{REGION(", \"tied_params\": {\"name\": \"w\"}"),
                  "/regions/0/tied_params: expected an array of {\"name\": "
                  "..., \"bytes\": ...}, got '{...}'"},
        Violation{TIED("[\"w\"]", W4),
                  "/regions/0/tied_params/0: expected an object {\"name\": "
                  "..., \"bytes\": ...}, got '\"w\"'"},
        Violation{TIED("[{\"bytes\": 4}]", W4),
                  "/regions/0/tied_params/0: missing required key 'name'"},
        Violation{TIED("[{\"name\": \"w\"}]", W4),
                  "/regions/0/tied_params/0: missing required key 'bytes'"},
        Violation{TIED("[{\"name\": \"\", \"bytes\": 4}]", W4),
                  "/regions/0/tied_params/0/name: expected a non-empty string"},
        Violation{TIED("[{\"name\": \"w\", \"bytes\": -4}]", W4),
                  "/regions/0/tied_params/0/bytes: expected an integer "
                  "between 0 and 2^40 (1 TiB), got '-4'"},
        Violation{TIED("[{\"name\": \"w\", \"bytes\": 4, \"size\": 4}]", W4),
                  "/regions/0/tied_params/0/size: unknown key"},
        Violation{TIED("[{\"name\": \"w\", \"bytes\": 11}]",
                       "[{\"name\": \"w\", \"bytes\": 11}]"),
                  "/regions/0/tied_params/0/bytes: the region's tied "
                  "parameters hold 11 bytes, more than its param_bytes 10, "
                  "which counts them"},
        Violation{TIED("[{\"name\": \"w\", \"bytes\": 4}, {\"name\": \"v\", "
                       "\"bytes\": 7}]",
                       W4),
                  "/regions/0/tied_params/1/bytes: the region's tied "
                  "parameters hold 11 bytes, more than its param_bytes 10"},
        Violation{TIED("[{\"name\": \"w\", \"bytes\": 4}, {\"name\": \"w\", "
                       "\"bytes\": 4}]",
                       W4),
                  "/regions/0/tied_params/1/name: tied parameter 'w' is "
                  "listed twice"},
        Violation{TIED(W4, "[{\"name\": \"w\", \"bytes\": 5}]"),
                  "/regions/1/tied_params/0/bytes: tied parameter 'w' has 5 "
                  "bytes here but 4 at /regions/0/tied_params/0; it is one "
                  "tensor"},
        Violation{TIED(W4, "[]"),
                  "/regions/0/tied_params/0/name: tied parameter 'w' is read "
                  "by no other region; list it in every region that reads "
                  "it, or not at all"}));

TEST(ModelJson, TiedParamsRoundTrip) {
  auto graph = parseModelJson(TIED(W4, W4), "m.json");
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  for (const Region &region : graph->regions) {
    ASSERT_EQ(region.tiedParams.size(), 1u);
    EXPECT_EQ(region.tiedParams[0].name, "w");
    EXPECT_EQ(region.tiedParams[0].bytes, 4);
    EXPECT_EQ(region.paramBytes, 10); // the reader counts them still
  }
  std::string printed = printModelJson(*graph);
  auto again = parseModelJson(printed, "printed.json");
  ASSERT_TRUE(bool(again)) << llvm::toString(again.takeError());
  EXPECT_EQ(printModelJson(*again), printed);
  EXPECT_NE(printed.find("\"tied_params\""), std::string::npos);
  // Absent: printed without the member.
  auto plain = parseModelJson(kGood, "m.json");
  ASSERT_TRUE(bool(plain)) << llvm::toString(plain.takeError());
  EXPECT_EQ(printModelJson(*plain).find("tied_params"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Schema, ModelJsonViolation,
    ::testing::Values(
        Violation{"[]", ": expected a JSON object at the top level, got '[]'"},
        Violation{"{\"regions\": []}", ": missing required key 'name'"},
        Violation{"{\"name\": \"m\"}", ": missing required key 'regions'"},
        Violation{"{\"name\": \"m\", \"regions\": []}",
                  "/regions: expected a non-empty array of regions"},
        Violation{"{\"name\": 3, \"regions\": [1]}",
                  "/name: expected a non-empty string, got '3'"},
        Violation{"{\"name\": \"m\", \"regions\": [1]}",
                  "/regions/0: expected a region object, got '1'"},
        Violation{"{\"name\": \"m\", \"format\": \"x\", \"regions\": [1]}",
                  "/format: expected \"hp-recompute-model\", got '\"x\"'"},
        Violation{"{\"name\": \"m\", \"version\": 2, \"regions\": [1]}",
                  "/version: expected 1, got '2'"},
        Violation{"{\"name\": \"m\", \"extra\": 1, \"regions\": [1]}",
                  "/extra: unknown key"},
        Violation{"{\"name\": \"m\", \"data_parallel\": {\"shard\": 0}, "
                  "\"regions\": [1]}",
                  "/data_parallel/shard: expected an integer between 1 and "
                  "1048576, got '0'"},
        Violation{"{\"name\": \"m\", \"data_parallel\": {\"replicate\": "
                  "\"2\"}, \"regions\": [1]}",
                  "/data_parallel/replicate: expected an integer between 1 "
                  "and 1048576, got '\"2\"'"},
        Violation{"{\"name\": \"m\", \"data_parallel\": 2, \"regions\": [1]}",
                  "/data_parallel: expected an object with \"shard\" and "
                  "\"replicate\", got '2'"},
        Violation{"{\"name\": \"m\", \"regions\": [{\"fwd_flops\": 1}]}",
                  "/regions/0: missing required key 'name'"},
        Violation{"{\"name\": \"m\", \"regions\": [{\"name\": \"a\", "
                  "\"fwd_flops\": 1, \"input_bytes\": 1, \"param_bytes\": 1}]}",
                  "/regions/0: missing required key 'saved_bytes'"},
        Violation{REGION(", \"saved_bytes\": -5"),
                  "/regions/0/saved_bytes: expected an integer between 0 and "
                  "2^40 (1 TiB), got '-5'"},
        Violation{REGION(", \"saved_bytes\": 9223372036854775807"),
                  "/regions/0/saved_bytes: expected an integer between 0 and "
                  "2^40 (1 TiB), got '9223372036854775807'"},
        Violation{REGION(", \"input_bytes\": 1.5"),
                  "/regions/0/input_bytes: expected an integer between 0 and "
                  "2^40"},
        Violation{REGION(", \"param_bytes\": \"7\""),
                  "/regions/0/param_bytes: expected an integer between 0 and "
                  "2^40"},
        Violation{REGION(", \"fwd_flops\": \"big\""),
                  "/regions/0/fwd_flops: expected a number between 0 and "
                  "1e21, got '\"big\"'"},
        Violation{REGION(", \"fwd_time_us\": -1"),
                  "/regions/0/fwd_time_us: expected a number between 0 and "
                  "1e12 us"},
        Violation{REGION(", \"fwd_time_us\": 1.7e308"),
                  "/regions/0/fwd_time_us: expected a number between 0 and "
                  "1e12 us, got '1.7e+308'"},
        Violation{REGION(", \"replay_time_us\": 2e12"),
                  "/regions/0/replay_time_us: expected a number between 0 "
                  "and 1e12 us"},
        Violation{REGION(", \"checkpoint\": 1"),
                  "/regions/0/checkpoint: expected false, true or "
                  "\"selective\", got '1'"},
        Violation{REGION(", \"checkpoint\": \"full\""),
                  "/regions/0/checkpoint: expected false, true or "
                  "\"selective\", got '\"full\"'"},
        Violation{REGION(", \"checkpoint\": \"selective\""),
                  "/regions/0/checkpoint: \"selective\" needs the region's "
                  "measured selective costs (selective_replay_time_us"},
        Violation{REGION(", \"checkpoint\": \"selective\", "
                         "\"checkpointable\": false, "
                         "\"selective_replay_time_us\": 1"),
                  "/regions/0/checkpoint: a region with \"checkpointable\": "
                  "false cannot be checkpointed"},
        Violation{REGION(", \"checkpointable\": \"no\""),
                  "/regions/0/checkpointable: expected true or false"},
        Violation{REGION(", \"checkpointable\": false, \"checkpoint\": true"),
                  "/regions/0/checkpoint: a region with \"checkpointable\": "
                  "false cannot"},
        Violation{REGION(", \"stage\": -1"),
                  "/regions/0/stage: expected a non-negative integer stage"},
        Violation{REGION(", \"savedbytes\": 1"),
                  "/regions/0/savedbytes: unknown key"},
        Violation{"{\"name\": \"m\", \"regions\": [{\"name\": \"a\", "
                  "\"fwd_flops\": 1, \"saved_bytes\": 1, \"input_bytes\": 1, "
                  "\"param_bytes\": 1}, {\"name\": \"a\", \"fwd_flops\": 1, "
                  "\"saved_bytes\": 1, \"input_bytes\": 1, \"param_bytes\": "
                  "1}]}",
                  "/regions/1/name: duplicate region name 'a'"},
        Violation{"{\"name\": \"m\", \"regions\": [{\"name\": \"a\", "
                  "\"fwd_flops\": 1, \"saved_bytes\": 1, \"input_bytes\": 1, "
                  "\"param_bytes\": 1, \"stage\": 1}, {\"name\": \"b\", "
                  "\"fwd_flops\": 1, \"saved_bytes\": 1, \"input_bytes\": 1, "
                  "\"param_bytes\": 1, \"stage\": 0}]}",
                  "/regions/1/stage: stage 0 comes after stage 1"}));

} // namespace
