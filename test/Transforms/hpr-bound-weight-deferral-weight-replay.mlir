// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=110' | FileCheck %s
// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=103' | FileCheck %s --check-prefix=FUSED
// RUN: hp-recompute-opt %s -hpr-recompute-pipeline='budget=110' | FileCheck %s --check-prefix=PLANNED
// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=110 weight-replay=0' | FileCheck %s --check-prefix=OFF
// RUN: not hp-recompute-opt %s -hpr-recompute-pipeline='weight-replay=0' 2>&1 | FileCheck %s --check-prefix=NO-BUDGET

// Step 2 (c): the dx drops its session's replay and the dw replays again for
// itself (weight_replay). As in hpr-bound-weight-deferral.mlir, rank 1 runs
// both dxs, then both dws; each stage has two regions that keep 1 byte under
// checkpoint and replay 50, of which the dw reads 10 (replay_weight_bytes),
// in 1 us (replay_time_us). At its second dx rank 1 holds the four inputs,
// mb 1's replay (100) and what mb 0's dw reads of its own (20): 124 bytes.
// Within 110, mb 0's dw may run before that dx (it delays that dx's send by
// a dw, 22 us, and rank 0's last backward waits for it), fuse with its dx (it
// delays mb 0's send as much), or replay for itself (2 us of rank 1's time,
// after its last send): the replay is the shortest step. The dws keep their
// places, and the peak falls to 104 (a dx with its session's whole replay).
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0.a" checkpoint flops 0.0 time_us 5.0 saved 50 input 1 params 0
    hpr.region "l0.b" checkpoint flops 0.0 time_us 5.0 saved 50 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1.a" checkpoint flops 0.0 time_us 10.0 saved 50 input 1 params 0 {replay_time_us = 1.0 : f64, replay_weight_bytes = 10 : i64}
    hpr.region "l1.b" checkpoint flops 0.0 time_us 10.0 saved 50 input 1 params 0 {replay_time_us = 1.0 : f64, replay_weight_bytes = 10 : i64}
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

// CHECK:      compute_order = array<i64: 0, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 2, 1, 0, 2, 1, 1>
// CHECK:      hpr.backward_input stage 1 mb 0{{$}}
// CHECK-NEXT: hpr.send_b stage 1 mb 0 peer 0
// CHECK-NEXT: hpr.backward_input stage 1 mb 1{{$}}
// CHECK-NEXT: hpr.send_b stage 1 mb 1 peer 0
// CHECK-NEXT: hpr.backward_weight stage 1 mb 0 weight_replay{{$}}
// CHECK-NEXT: hpr.backward_weight stage 1 mb 1{{$}}

// 103 bytes: mb 0's dx holds its whole replay and the inputs, 104 bytes,
// whatever its dw does; only a whole backward, which replays region by
// region, fits there.
// FUSED:      hpr.backward stage 1 mb 0
// FUSED-NOT:  weight_replay

// Planned: the replay for the dw right before it, and its dx drops the first
// (hpr-lower-runtime); hpr-verify admits the plan.
// PLANNED:      hpr.recompute %s1.mb0{{$}}
// PLANNED-NEXT: hpr.backward_input stage 1 mb 0 session(%s1.mb0) retain_on_unpack drops_replay
// PLANNED:      hpr.recompute %s1.mb1{{$}}
// PLANNED-NEXT: hpr.backward_input stage 1 mb 1 session(%s1.mb1) retain_on_unpack{{$}}
// PLANNED:      hpr.recompute %s1.mb0 {for_weight}
// PLANNED-NEXT: hpr.backward_weight stage 1 mb 0 session(%s1.mb0) frees_graph weight_replay
// PLANNED-NEXT: hpr.clear %s1.mb0
// PLANNED-NEXT: hpr.backward_weight stage 1 mb 1 session(%s1.mb1) frees_graph last_backward{{$}}

// weight-replay=0: the pass as before weight replays (the planner driver
// plans both): mb 0's dw runs before mb 1's dx.
// OFF:      hpr.backward_input stage 1 mb 0{{$}}
// OFF-NEXT: hpr.send_b stage 1 mb 0 peer 0
// OFF-NEXT: hpr.backward_weight stage 1 mb 0{{$}}
// OFF-NEXT: hpr.backward_input stage 1 mb 1{{$}}
// OFF-NOT:  weight_replay

// NO-BUDGET: hpr-recompute-pipeline: weight-replay applies with a budget only (hpr-bound-weight-deferral)
