//===- HPROps.td - hpr dialect operations ------------------*- tablegen -*-===//

#ifndef HPR_OPS
#define HPR_OPS

include "hpr/Dialect/HPR/HPRDialect.td"
include "hpr/Dialect/HPR/HPRInterfaces.td"
include "hpr/Dialect/HPR/HPRTypes.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/IR/SymbolInterfaces.td"

//===----------------------------------------------------------------------===//
// Model
//===----------------------------------------------------------------------===//

// Ranks, stages, microbatches and peers are indices; counts are positive.
// The ODS verifier checks both, before any op verifier runs.
def HPR_IndexAttr : ConfinedAttr<I64Attr, [IntNonNegative]>;
def HPR_CountAttr : ConfinedAttr<I64Attr, [IntPositive]>;

def HPR_ModelOp : HPR_Op<"model", [NoTerminator, SingleBlock,
                                   NoRegionArguments]> {
  let summary = "the model being trained: stages and their regions";
  let description = [{
    Holds one `hpr.stage` per pipeline stage, in increasing stage order.
    `dp_shard` and `dp_replicate`, absent when 1: the data-parallel layout
    each stage runs under (FSDP2 shards its parameters over `dp_shard`
    ranks, HSDP replicates the shards over `dp_replicate` groups); the cost
    model prices the collectives by them and `hpr-insert-unshard` places
    `hpr.unshard` / `hpr.reshard` when `dp_shard` > 1.

    ```mlir
    hpr.model "gpt" {
      hpr.stage 0 {
        hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0
            saved 4096 input 512 params 1024
      }
    }
    ```
  }];
  let arguments = (ins StrAttr:$name, OptionalAttr<HPR_CountAttr>:$dp_shard,
                       OptionalAttr<HPR_CountAttr>:$dp_replicate);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$name attr-dict-with-keyword $body";
  let hasRegionVerifier = 1;
}

def HPR_StageOp : HPR_Op<"stage", [NoTerminator, SingleBlock,
                                   NoRegionArguments,
                                   HasParent<"ModelOp">]> {
  let summary = "one pipeline stage: a contiguous run of regions";
  let arguments = (ins HPR_IndexAttr:$index);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$index attr-dict-with-keyword $body";
  let hasRegionVerifier = 1;
}

def HPR_RegionOp : HPR_Op<"region", [HasParent<"StageOp">]> {
  let summary = "a checkpointable region (one submodule call) and its costs";
  let description = [{
    `checkpoint`: the region's activations are recomputed in backward rather
    than kept; with `selective`, by the selective policy: the outputs of its
    op set (matmuls, attention) are saved and only the rest is recomputed,
    at the measured selective costs below. `non_checkpointable` marks code
    outside submodule calls (embedding, head, loss), which is always kept.
    Costs: forward FLOPs and measured time, bytes autograd saves inside the
    region (`saved`), the boundary input kept when the region is
    checkpointed (`input`) and its parameter bytes (`params`). In the attribute dictionary, absent when not
    profiled: the measured dx, dw and full backward times (`bwd_input_time_us`,
    `bwd_weight_time_us`, `bwd_time_us`), the forward under checkpoint
    (`checkpoint_fwd_time_us`), one replay (`replay_time_us`), the bytes of
    the gradients dx keeps for dw (`bwd_weight_input_bytes`), the
    transient bytes of one full backward (`bwd_workspace_bytes`), of dx
    (`bwd_input_workspace_bytes`) and of dw (`bwd_weight_workspace_bytes`;
    each absent: the full backward's) and what a
    checkpointed forward holds besides its input, the RNG states its replay
    restores (`checkpoint_state_bytes`), and what one replay allocates
    (`replay_bytes`; absent: `saved`, which may count the kept input again)
    and of that what a session still holds after dx, the tensors dw reads
    (`replay_weight_bytes`; absent: all of it);
    and the selective policy's forward and replay times
    (`selective_fwd_time_us`, `selective_replay_time_us`), the bytes it saves
    besides the input and checkpoint state (`selective_saved_bytes`) and what
    its replay allocates (`selective_replay_bytes`); and the bytes of its
    outputs (`output_bytes`: the last region's are the model output).
  }];
  let arguments = (ins StrAttr:$name, UnitAttr:$checkpoint,
                       UnitAttr:$selective, UnitAttr:$non_checkpointable,
                       F64Attr:$fwd_flops,
                       F64Attr:$fwd_time_us, I64Attr:$saved_bytes,
                       I64Attr:$input_bytes, I64Attr:$param_bytes,
                       OptionalAttr<F64Attr>:$bwd_input_time_us,
                       OptionalAttr<F64Attr>:$bwd_weight_time_us,
                       OptionalAttr<F64Attr>:$bwd_time_us,
                       OptionalAttr<F64Attr>:$checkpoint_fwd_time_us,
                       OptionalAttr<F64Attr>:$replay_time_us,
                       OptionalAttr<I64Attr>:$bwd_weight_input_bytes,
                       OptionalAttr<I64Attr>:$bwd_workspace_bytes,
                       OptionalAttr<I64Attr>:$bwd_input_workspace_bytes,
                       OptionalAttr<I64Attr>:$bwd_weight_workspace_bytes,
                       OptionalAttr<I64Attr>:$checkpoint_state_bytes,
                       OptionalAttr<I64Attr>:$replay_bytes,
                       OptionalAttr<I64Attr>:$replay_weight_bytes,
                       OptionalAttr<F64Attr>:$selective_fwd_time_us,
                       OptionalAttr<F64Attr>:$selective_replay_time_us,
                       OptionalAttr<I64Attr>:$selective_saved_bytes,
                       OptionalAttr<I64Attr>:$selective_replay_bytes,
                       OptionalAttr<I64Attr>:$output_bytes);
  let assemblyFormat = [{
    $name (`checkpoint` $checkpoint^)? (`selective` $selective^)?
    (`non_checkpointable` $non_checkpointable^)?
    `flops` $fwd_flops `time_us` $fwd_time_us `saved` $saved_bytes
    `input` $input_bytes `params` $param_bytes attr-dict
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Schedule and programs
//===----------------------------------------------------------------------===//

def HPR_ScheduleOp : HPR_Op<"schedule", [NoTerminator, SingleBlock,
                                         NoRegionArguments,
                                         IsolatedFromAbove]> {
  let summary = "a pipeline schedule: one program per rank";
  let description = [{
    `stage_to_rank[s]` is the rank that runs stage `s`. Holds exactly one
    `hpr.program` per rank, in rank order. Isolated from above, as its
    programs are, so that passes anchored on `hpr.program` nest through it
    (`builtin.module(hpr.schedule(hpr.program(...)))`) and run ranks in
    parallel.
  }];
  let arguments = (ins StrAttr:$name, HPR_CountAttr:$num_ranks,
                       HPR_CountAttr:$num_stages,
                       HPR_CountAttr:$num_microbatches,
                       DenseI64ArrayAttr:$stage_to_rank);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $name `ranks` $num_ranks `stages` $num_stages
    `microbatches` $num_microbatches `stage_to_rank` $stage_to_rank
    attr-dict-with-keyword $body
  }];
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// The rank that owns `stage`.
    int64_t getRankOf(int64_t stage) { return getStageToRank()[stage]; }
  }];
}

def HPR_ProgramOp : HPR_Op<"program", [NoTerminator, SingleBlock,
                                       NoRegionArguments, IsolatedFromAbove,
                                       HasParent<"ScheduleOp">]> {
  let summary = "the ordered actions of one rank";
  let description = [{
    Isolated from above: a handle or session can only be used by the rank
    that produced it. `compute_order`, when present, is the imported
    schedule's compute actions of this rank in order, three numbers each:
    the kind (0 forward, 1 backward_input, 2 backward_weight, 3 backward),
    the stage and the microbatch. The importer writes it from the schedule;
    hpr-bound-weight-deferral, which decides the schedule where memory is
    short, rewrites it with the order it chose; no other pass changes it,
    and hpr-verify compares the program with it action by action.
  }];
  let arguments = (ins HPR_IndexAttr:$rank,
                       OptionalAttr<DenseI64ArrayAttr>:$compute_order);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "`rank` $rank attr-dict-with-keyword $body";
  let hasRegionVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Actions
//===----------------------------------------------------------------------===//

/// An action of (stage, microbatch), the common shape of compute and comm.
class HPR_StageMicrobatchOp<string mnemonic, list<Trait> traits = []>
    : HPR_Op<mnemonic, !listconcat(traits, [HasParent<"ProgramOp">,
                                            HPR_ActionOpInterface])> {
  code planName = ?;
  code stageMicrobatchDecls = [{
    int64_t getStageIndex() { return static_cast<int64_t>(getStage()); }
    int64_t getMicrobatchIndex() {
      return static_cast<int64_t>(getMicrobatch());
    }
    ::llvm::StringRef getPlanName() { return }] # planName # [{; }
  }];
  let extraClassDeclaration = stageMicrobatchDecls;
  let hasVerifier = 1;
}

def HPR_ForwardOp : HPR_StageMicrobatchOp<"forward", [
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "forward of (stage, microbatch); yields its checkpoint handles";
  let description = [{
    `overlap` marks the forward half of an `OVERLAP_F_B` pair: it runs
    together with the backward action right after it.

    `no_checkpoint` marks a microbatch of a checkpointed stage that runs
    plainly and keeps every activation for its backward (no session, no
    replay), as `hpr-select-checkpoints` decides where that fits the memory
    budget and saves time.

    Lowered by `hpr-lower-runtime` for the runtimes: `waits`, the receive
    that brings its input (action indices of its program, sessions not
    counted), and `hands_to`, the stage on the same rank it hands its output
    to in memory.
  }];
  let planName = [{"forward"}];
  let arguments = (ins HPR_IndexAttr:$stage, HPR_IndexAttr:$microbatch, UnitAttr:$overlap,
                       UnitAttr:$no_checkpoint,
                       OptionalAttr<DenseI64ArrayAttr>:$waits,
                       OptionalAttr<HPR_IndexAttr>:$hands_to);
  let results = (outs HPR_HandleType:$handle);
  let assemblyFormat = [{
    `stage` $stage `mb` $microbatch (`overlap` $overlap^)?
    (`no_checkpoint` $no_checkpoint^)? (`waits` $waits^)?
    (`hands_to` $hands_to^)? attr-dict
  }];
}

/// dx, dw and full backward: the consumers of a recompute session.
/// `readsActivations` and `wholeBackward` are C++ conditions on the op
/// (ConsumerOpInterface); `runtimeArgs` are this kind of backward's own
/// members (most of them written by hpr-lower-runtime, as `frees_graph` on
/// every kind), printed by `runtimeFormat`.
class HPR_BackwardOpBase<string mnemonic, string plan,
                         code readsActivations = "true",
                         code wholeBackward = "false",
                         dag runtimeArgs = (ins), string runtimeFormat = "">
    : HPR_StageMicrobatchOp<mnemonic, [HPR_ConsumerOpInterface]> {
  let planName = "\"" # plan # "\"";
  let arguments = !con((ins HPR_IndexAttr:$stage, HPR_IndexAttr:$microbatch,
                            Optional<HPR_SessionType>:$session,
                            UnitAttr:$retain_on_unpack, UnitAttr:$overlap,
                            UnitAttr:$frees_graph), runtimeArgs);
  let assemblyFormat = [{
    `stage` $stage `mb` $microbatch (`session` `(` $session^ `)`)?
    (`retain_on_unpack` $retain_on_unpack^)? (`overlap` $overlap^)?
    (`frees_graph` $frees_graph^)? }] # runtimeFormat # [{ attr-dict
  }];
  let extraClassDeclaration = stageMicrobatchDecls # [{
    ::mlir::Value getSessionValue() { return getSession(); }
    void setSessionValue(::mlir::Value session) {
      getSessionMutable().clear();
      if (session)
        getSessionMutable().append(session);
    }
    bool getRetainOnUnpackFlag() { return getRetainOnUnpack(); }
    void setRetainOnUnpackFlag(bool retain) { setRetainOnUnpack(retain); }
    bool readsActivations() { return }] # readsActivations # [{; }
    bool isWholeBackward() { return }] # wholeBackward # [{; }
  }];
}

// The model input needs no gradient: the first stage's I computes nothing
// and reads no activation, and its W is the stage's whole backward, as
// torch.distributed.pipelining runs them (and as CostModel.h prices them).
def HPR_BackwardInputOp
    : HPR_BackwardOpBase<"backward_input", "backward_input",
                         "getStage() != 0", "false",
                         (ins OptionalAttr<DenseI64ArrayAttr>:$waits,
                              OptionalAttr<HPR_IndexAttr>:$hands_to,
                              UnitAttr:$drops_replay),
                         [{ (`waits` $waits^)? (`hands_to` $hands_to^)?
                            (`drops_replay` $drops_replay^)? }]> {
  let summary = "dx: gradient of the stage input (schedule action I)";
  let description = [{
    On the first stage (stage 0) it computes nothing: the model input needs
    no gradient. It reads no activation there, so it reads no session.

    Lowered by `hpr-lower-runtime` for the runtimes: `frees_graph` on the
    last backward of its stage and microbatch, `waits` (the receive of its
    output gradient, as action indices of its program), `hands_to` (the
    stage on the same rank it hands its input gradient to in memory) and
    `drops_replay` on the dx of a session that has an `hpr.recompute
    {for_weight}`: at its end the runtime drops every tensor the session
    replayed, and the replay for the dw brings back what the dw reads.
  }];
}
def HPR_BackwardWeightOp
    : HPR_BackwardOpBase<"backward_weight", "backward_weight", "true",
                         "getStage() == 0",
                         (ins UnitAttr:$last_backward,
                              UnitAttr:$weight_replay),
                         [{ (`last_backward` $last_backward^)?
                            (`weight_replay` $weight_replay^)? }]> {
  let summary = "dw: gradient of the stage weights (schedule action W)";
  let description = [{
    On the first stage (stage 0) it is the stage's whole backward: its I
    computed nothing.

    `weight_replay` (decided by `hpr-bound-weight-deferral`): its session
    is dropped after its dx and replayed again for it, by an
    `hpr.recompute {for_weight}` that `hpr-insert-recompute` places right
    before it; nothing of the replay lives between them. Only on a session
    read by a dx and then this dw (`[hpr.verify.weight-replay]`).

    Lowered by `hpr-lower-runtime` for the runtimes: `frees_graph` on the
    last backward of its stage and microbatch, `last_backward` on the last
    W or B of its stage (where the stage's gradients are complete).
  }];
}
def HPR_BackwardOp
    : HPR_BackwardOpBase<"backward", "backward", "true", "true",
                         (ins UnitAttr:$last_backward,
                              OptionalAttr<DenseI64ArrayAttr>:$waits,
                              OptionalAttr<HPR_IndexAttr>:$hands_to,
                              UnitAttr:$fused),
                         [{ (`last_backward` $last_backward^)?
                            (`waits` $waits^)? (`hands_to` $hands_to^)?
                            (`fused` $fused^)? }]> {
  let summary = "full backward, dx and dw together (schedule action B)";
  let description = [{
    Lowered by `hpr-lower-runtime` for the runtimes: `frees_graph`,
    `last_backward`, `waits` and `hands_to`, as on `hpr.backward_input` and
    `hpr.backward_weight`.

    `fused` (planner-internal, written by `hpr-bound-weight-deferral` with
    `mark-fused`): the schedule's dx and dw of this (stage, microbatch),
    fused by the pass to bound dw deferral. Its `after-choice` run, after
    `hpr-select-checkpoints`, may split the pair again, and removes every
    mark; runtimes do not read it.
  }];
}

/// Point-to-point transfers between ranks; a receive adds `recvArgs`.
class HPR_CommOp<string mnemonic, dag recvArgs = (ins), string recvFormat = "">
    : HPR_StageMicrobatchOp<mnemonic, []> {
  let planName = "\"" # mnemonic # "\"";
  let description = [{
    `peer` is the other rank. `batched` marks a transfer issued together
    with the next one (the legacy `0SEND_F0_1RECV_B0` cells: every part but
    the last carries it). `tag` is the message tag (runtimes match a receive
    to the first message from its source with its tag): `hpr-lower-runtime`
    writes (sending stage, microbatch, direction) where none is given; a
    plan read back from JSON keeps its own. `hpr-verify-comm` checks that
    both ends agree and that a rank's tags towards one peer in one direction
    are distinct.
  }];
  let arguments = !con((ins HPR_IndexAttr:$stage, HPR_IndexAttr:$microbatch,
                            HPR_IndexAttr:$peer,
                            UnitAttr:$batched,
                            OptionalAttr<HPR_IndexAttr>:$tag), recvArgs);
  let assemblyFormat = [{
    `stage` $stage `mb` $microbatch `peer` $peer (`batched` $batched^)?
    (`tag` $tag^)? }] # recvFormat # [{ attr-dict
  }];
}

/// A receive; `posts` is what to post when it is reached
/// (docs/plan-format.md): the indices of its program's actions (sessions not
/// counted) that are receives, in posting order. `hpr-lower-runtime` writes
/// it on every receive of a module that gives none; a plan read back from
/// JSON keeps its own (`hpr-verify-comm` checks it, [hpr.schedule.posts]).
class HPR_RecvOp<string mnemonic>
    : HPR_CommOp<mnemonic, (ins OptionalAttr<DenseI64ArrayAttr>:$posts),
                 [{ (`posts` $posts^)? }]>;

def HPR_SendFOp : HPR_CommOp<"send_f"> {
  let summary = "send the forward activation to the next stage's rank";
}
def HPR_RecvFOp : HPR_RecvOp<"recv_f"> {
  let summary = "receive the forward activation from the previous stage";
}
def HPR_SendBOp : HPR_CommOp<"send_b"> {
  let summary = "send the input gradient to the previous stage's rank";
}
def HPR_RecvBOp : HPR_RecvOp<"recv_b"> {
  let summary = "receive the output gradient from the next stage's rank";
}

/// Stage-level actions carried through unchanged (FSDP and grad reduction).
class HPR_PassthroughOp<string mnemonic>
    : HPR_Op<mnemonic, [HasParent<"ProgramOp">, HPR_ActionOpInterface]> {
  let arguments = (ins HPR_IndexAttr:$stage);
  let assemblyFormat = "`stage` $stage attr-dict";
  let extraClassDeclaration = [{
    int64_t getStageIndex() { return static_cast<int64_t>(getStage()); }
    int64_t getMicrobatchIndex() { return -1; }
    ::llvm::StringRef getPlanName() { return "}] # mnemonic # [{"; }
  }];
  let hasVerifier = 1;
}

def HPR_UnshardOp : HPR_PassthroughOp<"unshard"> {
  let summary = "gather the stage's sharded parameters";
}
def HPR_ReshardOp : HPR_PassthroughOp<"reshard"> {
  let summary = "free the stage's gathered parameters";
}
def HPR_ReduceGradOp : HPR_PassthroughOp<"reduce_grad"> {
  let summary = "reduce the stage's gradients across data-parallel ranks";
}

def HPR_IdleOp : HPR_Op<"idle", [HasParent<"ProgramOp">,
                                 HPR_ActionOpInterface]> {
  let summary = "an idle slot (an empty schedule cell)";
  let assemblyFormat = "attr-dict";
  let extraClassDeclaration = [{
    int64_t getStageIndex() { return -1; }
    int64_t getMicrobatchIndex() { return -1; }
    ::llvm::StringRef getPlanName() { return "idle"; }
  }];
}

//===----------------------------------------------------------------------===//
// Recompute sessions
//===----------------------------------------------------------------------===//

def HPR_SessionOp : HPR_Op<"session", [
    HasParent<"ProgramOp">,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "binds the checkpoint handles of one forward to a session";
  let description = [{
    Costs nothing at run time: it names the session (`s{stage}.mb{mb}`) that
    the forward's checkpoints will be recomputed into.

    ```mlir
    %h = hpr.forward stage 3 mb 0
    %s = hpr.session %h as "s3.mb0"
    ```
  }];
  let arguments = (ins HPR_HandleType:$handle, StrAttr:$sid);
  let results = (outs HPR_SessionType:$session);
  let assemblyFormat = "$handle `as` $sid attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The forward whose handles this session binds.
    ForwardOp getForward() { return getHandle().getDefiningOp<ForwardOp>(); }
  }];
}

/// Session lifecycle actions: they act on the session's (stage, microbatch).
class HPR_SessionActionOp<string mnemonic>
    : HPR_Op<mnemonic, [HasParent<"ProgramOp">, HPR_ActionOpInterface]> {
  let arguments = (ins HPR_SessionType:$session);
  let assemblyFormat = "$session attr-dict";
  let extraClassDeclaration = [{
    /// The session acted on (ops are declared alphabetically, hence the
    /// out-of-line definitions).
    SessionOp getSessionOp();
    int64_t getStageIndex();
    int64_t getMicrobatchIndex();
    ::llvm::StringRef getPlanName() { return "}] # mnemonic # [{"; }
  }];
}

def HPR_RecomputeOp : HPR_SessionActionOp<"recompute"> {
  let summary = "replay the session's checkpointed forward once";
  let description = [{
    Placed before the session's first consumer: right before it (`jit`) or
    earlier, as a prefetch. A prefetch replays every checkpointed region of
    the forward at its place, and the tensors live until the clear.

    `in_backward` (jit only, on a session whose one reader is a full
    backward): the replay runs inside that backward, region by region, each
    region replayed when the backward first reads it and its tensors dropped
    as they are read, as torch's checkpoint does; only one region's replayed
    tensors are live at a time. The op then marks where the replay's time
    goes; hpr-verify checks that nothing but communication separates it from
    its reader.

    `regions` (a piece): the op replays only these of the forward's
    checkpointed regions, numbered 0.. in forward order. A session's replay
    is then several pieces, each placed on its own, whose regions are
    disjoint and together every checkpointed region of the stage; a piece
    marked `in_backward` is the session's last one and replays its regions
    inside the backward, as above, which reads the prefetched pieces'
    regions without replaying them and drops each as it reads it.

    ```mlir
    hpr.recompute %s {regions = array<i64: 1>}
    hpr.forward stage 1 mb 3
    hpr.recompute %s {in_backward, regions = array<i64: 0>}
    hpr.backward stage 1 mb 0 session %s
    ```

    `for_weight` (the replay for a dw): the session's second replay, after
    its dx, which dropped the first (`drops_replay`), and before its dw
    marked `weight_replay`, of what that dw reads. Whole: never
    `in_backward`, no `regions`; at most one per session
    (`[hpr.verify.weight-replay]`).

    ```mlir
    hpr.recompute %s
    hpr.backward_input stage 1 mb 0 session(%s) retain_on_unpack drops_replay
    hpr.forward stage 1 mb 3
    hpr.recompute %s {for_weight}
    hpr.backward_weight stage 1 mb 0 session(%s) weight_replay
    hpr.clear %s
    ```
  }];
  let arguments = (ins HPR_SessionType:$session, UnitAttr:$in_backward,
                       OptionalAttr<DenseI64ArrayAttr>:$regions,
                       UnitAttr:$for_weight);
  let hasVerifier = 1;
  let builders = [
    OpBuilder<(ins "::mlir::Value":$session, "bool":$in_backward), [{
      build($_builder, $_state, session, in_backward,
            ::mlir::DenseI64ArrayAttr(), /*for_weight=*/false);
    }]>
  ];
}

def HPR_ClearOp : HPR_SessionActionOp<"clear"> {
  let summary = "drop the session's recomputed tensors after the last consumer";
}

#endif // HPR_OPS
