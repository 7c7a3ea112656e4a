//===- Model.h - Model description: stages, regions, costs ------*- C++ -*-===//
//
// What the planner needs to know about a model: the checkpointable regions in
// execution order, their costs, and how they are split into pipeline stages.
// Importers (JSON graph, TorchScript) fill a ModelGraph; partitioning turns it
// into a StagedModel for a given number of stages.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_MODEL_MODEL_H
#define HPR_MODEL_MODEL_H

#include <cstdint>
#include <string>
#include <vector>

namespace mlir::hpr::model {

/// A parameter that more than one region reads (a tied weight, such as a
/// token embedding shared with the LM head): its fully qualified name and
/// bytes.
struct TiedParam {
  std::string name;
  int64_t bytes = 0;
};

/// One region: a submodule call (e.g. `layers.3`), or the code between such
/// calls (embedding, head, loss), which is never checkpointable.
struct Region {
  std::string name;
  bool checkpoint = false;    ///< recomputed in backward instead of saved
  bool selective = false;     ///< checkpointed with the selective policy: the
                              ///< outputs of its op set are saved, the rest
                              ///< recomputed (docs/models.md, "Policies")
  bool checkpointable = true; ///< false for code outside submodule calls
  double fwdFlops = 0;
  double fwdTimeUs = 0;           ///< 0 when not profiled
  double bwdInputTimeUs = 0;      ///< measured dx (I) time; 0 when not profiled
  double bwdWeightTimeUs = 0;     ///< measured dw (W) time; 0 when not profiled
  double bwdTimeUs = 0;           ///< one full backward (B); 0 = dx + dw
  double checkpointFwdTimeUs = 0; ///< forward under checkpoint; 0 = fwdTimeUs
  double replayTimeUs = 0;        ///< one replay (recompute); 0 = fwdTimeUs
  int64_t savedBytes = 0;         ///< activations autograd saves for backward
  int64_t inputBytes = 0;         ///< boundary input kept when checkpointed
  /// The parameters it reads, the tied ones included; in a StagedModel, the
  /// tied ones an earlier region of its stage reads are not counted again.
  int64_t paramBytes = 0;
  /// The parameters it shares with other regions (part of paramBytes).
  std::vector<TiedParam> tiedParams;
  int64_t bwdWeightInputBytes = 0; ///< gradients I keeps for W; 0 = unknown
  int64_t bwdWorkspaceBytes = 0;   ///< transient bytes of its backward (B)
  /// Transient bytes of its dx (I) and of its dw (W); 0 = bwdWorkspaceBytes.
  int64_t bwdInputWorkspaceBytes = 0;
  int64_t bwdWeightWorkspaceBytes = 0;
  int64_t checkpointStateBytes = 0; ///< held by a checkpointed forward besides
                                    ///< its input (RNG states); 0 = unknown
  int64_t replayBytes = 0;          ///< one replay allocates; 0 = savedBytes
  /// Of one replay, what a session still holds after dx: the tensors dw
  /// reads (hpr.split.release-unread); 0 = unknown, all of it.
  int64_t replayWeightBytes = 0;
  /// The selective policy's costs, measured (0 = not measured): its forward,
  /// its replay, what it saves besides the input and checkpoint state, and
  /// what its replay allocates.
  double selectiveFwdTimeUs = 0;
  double selectiveReplayTimeUs = 0;
  int64_t selectiveSavedBytes = 0;
  int64_t selectiveReplayBytes = 0;
  /// The bytes of its outputs (measured; 0 = unknown). The last region's
  /// are the model output, which the loss outside the model reads: held from
  /// the forward to its backward, and its gradient made inside that backward.
  int64_t outputBytes = 0;
  int stage = -1; ///< fixed pipeline stage, -1 = chosen by partition
};

/// The measured costs a region may carry, each 0 when not measured. Their
/// names are the model JSON keys and the `hpr.region` attribute names alike,
/// so readers and writers of both walk these tables.
struct MeasuredTime {
  const char *key;
  double Region::*field;
};
struct MeasuredBytes {
  const char *key;
  int64_t Region::*field;
};
inline constexpr MeasuredTime kMeasuredTimes[] = {
    {"bwd_input_time_us", &Region::bwdInputTimeUs},
    {"bwd_weight_time_us", &Region::bwdWeightTimeUs},
    {"bwd_time_us", &Region::bwdTimeUs},
    {"checkpoint_fwd_time_us", &Region::checkpointFwdTimeUs},
    {"replay_time_us", &Region::replayTimeUs},
    {"selective_fwd_time_us", &Region::selectiveFwdTimeUs},
    {"selective_replay_time_us", &Region::selectiveReplayTimeUs}};
inline constexpr MeasuredBytes kMeasuredBytes[] = {
    {"bwd_weight_input_bytes", &Region::bwdWeightInputBytes},
    {"bwd_workspace_bytes", &Region::bwdWorkspaceBytes},
    {"bwd_input_workspace_bytes", &Region::bwdInputWorkspaceBytes},
    {"bwd_weight_workspace_bytes", &Region::bwdWeightWorkspaceBytes},
    {"checkpoint_state_bytes", &Region::checkpointStateBytes},
    {"replay_bytes", &Region::replayBytes},
    {"replay_weight_bytes", &Region::replayWeightBytes},
    {"selective_saved_bytes", &Region::selectiveSavedBytes},
    {"selective_replay_bytes", &Region::selectiveReplayBytes},
    {"output_bytes", &Region::outputBytes}};

/// The data-parallel layout each pipeline stage is replicated over
/// (docs/models.md, "Data parallelism"): FSDP2 shards a stage's parameters
/// over `shard` ranks, HSDP replicates those shards over `replicate` groups.
/// 1 x 1 is no data parallelism.
struct DataParallel {
  int64_t shard = 1;
  int64_t replicate = 1;
};

/// A model as imported: regions in execution order.
struct ModelGraph {
  std::string name;
  std::vector<Region> regions;
  DataParallel dataParallel;
};

/// One pipeline stage: a contiguous run of regions.
struct Stage {
  int index = 0;
  std::vector<Region> regions;
};

/// A model split into the schedule's stages.
struct StagedModel {
  std::string name;
  std::vector<Stage> stages;
  DataParallel dataParallel;
};

} // namespace mlir::hpr::model

#endif // HPR_MODEL_MODEL_H
