// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=204' | FileCheck %s --check-prefix=ROOMY
// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=150' | FileCheck %s --check-prefix=MOVED
// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=101' | FileCheck %s --check-prefix=FUSED
// RUN: not hp-recompute-opt %s -hpr-bound-weight-deferral='budget=53' 2>&1 | FileCheck %s --check-prefix=TIGHT
// RUN: not hp-recompute-opt %s -hpr-bound-weight-deferral 2>&1 | FileCheck %s --check-prefix=NO-BUDGET
// RUN: hp-recompute-opt %s -hpr-recompute-pipeline='budget=150' | FileCheck %s --check-prefix=PLANNED
// RUN: hp-recompute-opt %s -hpr-recompute-pipeline='budget=101' | FileCheck %s --check-prefix=PLANNED-FUSED
// RUN: not hp-recompute-opt %s -hpr-recompute-pipeline='budget=150 deferral-budget=200' 2>&1 | FileCheck %s --check-prefix=DEFERRAL-ABOVE

// Two ranks, two microbatches, zero-bubble style on rank 1: both dxs, then
// both dws. A stage has two regions; each keeps 1 byte under checkpoint and
// its replay brings back 50. A session read by dx and dw holds its whole
// replay (100) from the dx to the dw: rank 1 peaks at 204 bytes (four
// inputs, two replays) from its second dx to its first dw. A whole backward
// replays region by region and holds 50 at most (rank 0: 54).
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0.a" checkpoint flops 0.0 time_us 10.0 saved 50 input 1 params 0
    hpr.region "l0.b" checkpoint flops 0.0 time_us 10.0 saved 50 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1.a" checkpoint flops 0.0 time_us 10.0 saved 50 input 1 params 0
    hpr.region "l1.b" checkpoint flops 0.0 time_us 10.0 saved 50 input 1 params 0
  }
}
hpr.schedule "zb" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
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
  hpr.program rank 1 attributes {compute_order = array<i64: 0, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 2, 1, 0, 2, 1, 1>} {
    hpr.recv_f stage 1 mb 0 peer 0
    %h2 = hpr.forward stage 1 mb 0
    hpr.recv_f stage 1 mb 1 peer 0
    %h3 = hpr.forward stage 1 mb 1
    hpr.backward_input stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    hpr.backward_input stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
    hpr.backward_weight stage 1 mb 0
    hpr.backward_weight stage 1 mb 1
  }
}

// Within the budget: nothing moves (the imported compute order stands).
// ROOMY:      compute_order = array<i64: 0, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 2, 1, 0, 2, 1, 1>
// ROOMY:      hpr.backward_input stage 1 mb 1
// ROOMY-NEXT: hpr.send_b stage 1 mb 1 peer 0
// ROOMY-NEXT: hpr.backward_weight stage 1 mb 0

// 150 bytes: one replay must end before the second dx. Running mb 0's dw
// before that dx (one replay at a time, 104 bytes) delays the second dx by a
// dw; fusing mb 0 into one backward delays the first dx's send by a dw, and
// rank 0 waits for it. The move is the shorter step.
// MOVED:      hpr.backward_input stage 1 mb 0
// MOVED-NEXT: hpr.send_b stage 1 mb 0 peer 0
// MOVED-NEXT: hpr.backward_weight stage 1 mb 0
// MOVED-NEXT: hpr.backward_input stage 1 mb 1
// MOVED-NEXT: hpr.send_b stage 1 mb 1 peer 0
// MOVED-NEXT: hpr.backward_weight stage 1 mb 1

// 101 bytes: a session read by dx and dw holds its whole replay (100, and
// the microbatches' inputs), so only whole backwards fit (54 bytes); the
// compute order is recorded anew.
// FUSED:      hpr.program rank 1 attributes {compute_order = array<i64: 0, 1, 0, 0, 1, 1, 3, 1, 0, 3, 1, 1>}
// FUSED:      hpr.backward stage 1 mb 0
// FUSED-NEXT: hpr.send_b stage 1 mb 0 peer 0
// FUSED-NEXT: hpr.backward stage 1 mb 1
// FUSED-NEXT: hpr.send_b stage 1 mb 1 peer 0
// FUSED-NEXT: }

// TIGHT: error: hpr-bound-weight-deferral: no dw placement fits budget 53 bytes: rank 0 holds 54 bytes of activations at a peak where no dw is pending, the least this schedule reaches by running dws earlier{{$}}
// NO-BUDGET: error: hpr-bound-weight-deferral: budget must be > 0 bytes, got 0

// The pipeline bounds the deferral before it assigns sessions, and hpr-verify
// holds the plan to the order the pass chose.
// PLANNED:       hpr.backward_input stage 1 mb 0 session(%s1.mb0) retain_on_unpack
// PLANNED-NEXT:  hpr.send_b stage 1 mb 0 peer 0
// PLANNED-NEXT:  hpr.backward_weight stage 1 mb 0 session(%s1.mb0)
// PLANNED-NEXT:  hpr.clear %s1.mb0
// PLANNED-FUSED: hpr.recompute %s1.mb0 {in_backward}
// PLANNED-FUSED: hpr.backward stage 1 mb 0 session(%s1.mb0)

// DEFERRAL-ABOVE: hpr-recompute-pipeline: deferral-budget must be between 0 and budget, got 200
