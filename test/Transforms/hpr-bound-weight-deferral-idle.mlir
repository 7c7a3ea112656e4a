// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=150' | FileCheck %s
// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=204' | FileCheck %s --check-prefix=ROOMY
// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=150 mark-fused=1' | FileCheck %s --check-prefix=MARK

// Step 5: where the bound changed the schedule, dws move into idle time.
// Rank 1 runs both dxs, both dws, then both sends: two sessions held from
// dx to dw (each keeps its replay, 100 bytes) exceed 150 bytes, so the
// bound fuses mb 0's dx and dw (steps 2-4). Then mb 1's dw moves after the
// sends, to the end of the program, where rank 1 would wait: rank 0's
// backwards (1 us regions, rank 1's take 10 us) start a dw earlier. mb 0's
// stays fused: its dw after mb 0's send would hold both replays.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0.a" checkpoint flops 0.0 time_us 1.0 saved 50 input 1 params 0
    hpr.region "l0.b" checkpoint flops 0.0 time_us 1.0 saved 50 input 1 params 0
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
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h2 = hpr.forward stage 1 mb 0
    hpr.recv_f stage 1 mb 1 peer 0
    %h3 = hpr.forward stage 1 mb 1
    hpr.backward_input stage 1 mb 0
    hpr.backward_input stage 1 mb 1
    hpr.backward_weight stage 1 mb 0
    hpr.backward_weight stage 1 mb 1
    hpr.send_b stage 1 mb 0 peer 0
    hpr.send_b stage 1 mb 1 peer 0
  }
}

// CHECK:      hpr.backward stage 1 mb 0
// CHECK-NEXT: hpr.backward_input stage 1 mb 1
// CHECK-NEXT: hpr.send_b stage 1 mb 0 peer 0
// CHECK-NEXT: hpr.send_b stage 1 mb 1 peer 0
// CHECK-NEXT: hpr.backward_weight stage 1 mb 1
// CHECK-NEXT: }

// With mark-fused (where an after-choice run follows: the pipeline with
// select=auto) the pair it fused says so, for that run to split again.
// MARK:      hpr.backward stage 1 mb 0 fused{{$}}
// MARK-NEXT: hpr.backward_input stage 1 mb 1

// Within the budget the schedule keeps its own dw placement.
// ROOMY:      hpr.backward_weight stage 1 mb 1
// ROOMY-NEXT: hpr.send_b stage 1 mb 0 peer 0
// ROOMY-NEXT: hpr.send_b stage 1 mb 1 peer 0
// ROOMY-NEXT: }
