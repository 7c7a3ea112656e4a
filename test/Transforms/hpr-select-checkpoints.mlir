// RUN: hp-recompute-opt %s -hpr-select-checkpoints='budget=150' | FileCheck %s --check-prefix=MIXED
// RUN: hp-recompute-opt %s -hpr-select-checkpoints='budget=200' | FileCheck %s --check-prefix=ROOMY
// RUN: hp-recompute-opt %s -hpr-select-checkpoints='budget=101' | FileCheck %s --check-prefix=MIXED
// RUN: not hp-recompute-opt %s -hpr-select-checkpoints='budget=100' 2>&1 | FileCheck %s --check-prefix=TIGHT
// RUN: hp-recompute-opt %s -hpr-select-checkpoints='budget=150 bubble=1' | FileCheck %s --check-prefix=MIXED
// RUN: hp-recompute-opt %s -hpr-select-checkpoints='budget=150 bubble=1' | FileCheck %s --check-prefix=NO-COPY
// RUN: not hp-recompute-opt %s -hpr-select-checkpoints='budget=100 bubble=1' 2>&1 | FileCheck %s --check-prefix=TIGHT
// RUN: not hp-recompute-opt %s -hpr-select-checkpoints 2>&1 | FileCheck %s --check-prefix=NO-BUDGET
// RUN: hp-recompute-opt %s --pass-pipeline='builtin.module(hpr-select-checkpoints{budget=150},hpr.schedule(hpr.program(hpr-assign-sessions,hpr-insert-recompute,hpr-insert-clear,hpr-verify)))' | FileCheck %s --check-prefixes=PLANNED,PLANNED-JIT
// RUN: hp-recompute-opt %s -hpr-recompute-pipeline='select=auto budget=150 policy=bubble' | FileCheck %s --check-prefixes=PLANNED,PLANNED-BUBBLE
// RUN: not hp-recompute-opt %s -hpr-recompute-pipeline='budget=64' 2>&1 | FileCheck %s --check-prefix=PIPELINE
// RUN: hp-recompute-opt %S/Inputs/rank-without-actions.mlir -hpr-select-checkpoints='budget=150' | FileCheck %s --check-prefix=IDLE-RANK
// RUN: not hp-recompute-opt %S/Inputs/rank-without-actions.mlir -hpr-select-checkpoints='budget=50' 2>&1 | FileCheck %s --check-prefix=IDLE-RANK-TIGHT

// GPipe on two ranks, two microbatches. A region keeps 1 byte under
// checkpoint and 100 without (its replay brings the 100 back). Per rank:
// everything checkpointed peaks at 102 (two inputs and one replay), nothing
// checkpointed at 200 (both microbatches' activations), and mb 0 plain with
// mb 1 checkpointed at 101: the least.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" flops 0.0 time_us 10.0 saved 100 input 1 params 0
    hpr.region "head" non_checkpointable flops 0.0 time_us 1.0 saved 0 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1" flops 0.0 time_us 10.0 saved 100 input 1 params 0
  }
}
hpr.schedule "gpipe" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
    hpr.recv_b stage 0 mb 1 peer 1
    hpr.backward stage 0 mb 1
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h2 = hpr.forward stage 1 mb 0
    hpr.recv_f stage 1 mb 1 peer 0
    %h3 = hpr.forward stage 1 mb 1
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    hpr.backward stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
  }
}

// 150 bytes, and 101: both regions stay checkpointed (either alone peaks at
// 200 on its rank), and microbatch 0 of each stage runs plainly: 100 kept
// bytes in place of 1 plus its replay peak at 101; doing the same for mb 1
// too would reach 200.
// MIXED:      hpr.region "l0" checkpoint
// MIXED:      hpr.region "head" non_checkpointable
// MIXED:      hpr.region "l1" checkpoint
// MIXED:      hpr.forward stage 0 mb 0 no_checkpoint
// MIXED:      hpr.forward stage 0 mb 1{{$}}
// MIXED:      hpr.forward stage 1 mb 0 no_checkpoint
// MIXED:      hpr.forward stage 1 mb 1{{$}}

// 200 bytes fit without any checkpoint: no recompute at all.
// ROOMY-NOT:  {{ checkpoint | no_checkpoint}}
// ROOMY:      hpr.region "l0" flops
// ROOMY-NOT:  {{ checkpoint | no_checkpoint}}
// ROOMY:      hpr.schedule

// With bubble=1 the contenders are planned on copies of the module nested in
// it; none is left behind.
// NO-COPY:     {{^}}module {
// NO-COPY-NOT: {{^ +}}module {

// TIGHT: error: hpr-select-checkpoints: no checkpoint choice fits budget 100 bytes; the smallest feasible budget found is 101 bytes (rank 0)
// NO-BUDGET: error: hpr-select-checkpoints: budget must be > 0 bytes, got 0

// The plain microbatches get no session, and the verifier accepts their
// consumers without one (the pipeline's hpr-lower-runtime adds what the
// runtimes read). Jit replays mb 1 inside its backward; bubble replays it
// whole in the wait for its gradient, after B0, which is done with mb 0's
// 100 kept bytes by then (1 + 100 <= 150).
// PLANNED:      %h0.mb0 = hpr.forward stage 0 mb 0 no_checkpoint
// PLANNED-NEXT: hpr.send_f stage 0 mb 0
// PLANNED-NEXT: %h0.mb1 = hpr.forward stage 0 mb 1
// PLANNED-NEXT: %s0.mb1 = hpr.session
// PLANNED:      hpr.backward stage 0 mb 0{{( frees_graph waits \[4\])?$}}
// PLANNED-JIT:         hpr.recompute %s0.mb1 {in_backward}
// PLANNED-JIT-NEXT:    hpr.backward stage 0 mb 1 session(%s0.mb1)
// PLANNED-BUBBLE:      hpr.recompute %s0.mb1{{$}}
// PLANNED-BUBBLE-NEXT: hpr.recv_b stage 0 mb 1
// PLANNED-BUBBLE-NEXT: hpr.backward stage 0 mb 1 session(%s0.mb1)

// Without select=auto the checkpoint marks stand; the budget bounds dw
// deferral only (this GPipe has no dw), which names the rank that cannot fit.
// PIPELINE: error: hpr-bound-weight-deferral: no dw placement fits budget 64 bytes: rank 0 holds 200 bytes of activations at a peak where no dw is pending

// A rank without actions (hpr-verify-comm refuses such a module, but this
// pass may run alone) holds nothing: the choice is made for the other rank,
// and the smallest budget found is that rank's.
// IDLE-RANK: hpr.region "l0" flops
// IDLE-RANK: hpr.program rank 1
// IDLE-RANK-TIGHT: error: hpr-select-checkpoints: no checkpoint choice fits budget 50 bytes; the smallest feasible budget found is 100 bytes (rank 0)
