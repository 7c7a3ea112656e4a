// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=100000 fuse-all=1' | FileCheck %s
// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=100000 fuse-all=1 mark-fused=1' | FileCheck %s --check-prefix=MARK
// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=100000' | FileCheck %s --check-prefix=KEEP

// Step 0 (fuse-all): within the budget, every dx fuses with its dw into one
// backward at the dx, the schedule the dws were deferred from (ZB-H1's is
// 1F1B's), on each stage whose weight gradients are then added in the order
// they were. Rank 1 runs stage 1's dws in its dxs' order: both pairs fuse.
// Rank 0 runs stage 0's dws in the other order (mb 1's first): fused at
// their dxs they would add mb 0's gradient first, so that stage stays split.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0.a" checkpoint flops 0.0 time_us 1.0 saved 50 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1.a" checkpoint flops 0.0 time_us 10.0 saved 50 input 1 params 0
  }
}
hpr.schedule "zb" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward_input stage 0 mb 0
    hpr.recv_b stage 0 mb 1 peer 1
    hpr.backward_input stage 0 mb 1
    hpr.backward_weight stage 0 mb 1
    hpr.backward_weight stage 0 mb 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h2 = hpr.forward stage 1 mb 0
    hpr.backward_input stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    hpr.recv_f stage 1 mb 1 peer 0
    %h3 = hpr.forward stage 1 mb 1
    hpr.backward_input stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
    hpr.backward_weight stage 1 mb 0
    hpr.backward_weight stage 1 mb 1
  }
}

// CHECK-LABEL: hpr.program rank 0
// CHECK:       hpr.backward_input stage 0 mb 0
// CHECK:       hpr.backward_input stage 0 mb 1
// CHECK-NEXT:  hpr.backward_weight stage 0 mb 1
// CHECK-NEXT:  hpr.backward_weight stage 0 mb 0
// CHECK-LABEL: hpr.program rank 1
// CHECK:       hpr.forward stage 1 mb 0
// CHECK-NEXT:  hpr.backward stage 1 mb 0{{$}}
// CHECK-NEXT:  hpr.send_b stage 1 mb 0 peer 0
// CHECK:       hpr.forward stage 1 mb 1
// CHECK-NEXT:  hpr.backward stage 1 mb 1{{$}}
// CHECK-NEXT:  hpr.send_b stage 1 mb 1 peer 0
// CHECK-NEXT:  }

// With mark-fused (an after-choice run follows) the fused pairs say so: that
// run may split them again into idle time.
// MARK-LABEL: hpr.program rank 1
// MARK:       hpr.backward stage 1 mb 0 fused{{$}}
// MARK:       hpr.backward stage 1 mb 1 fused{{$}}

// Without fuse-all, a schedule within the budget keeps its dw placement.
// KEEP-LABEL: hpr.program rank 1
// KEEP:       hpr.backward_input stage 1 mb 0
// KEEP:       hpr.backward_weight stage 1 mb 0
// KEEP-NEXT:  hpr.backward_weight stage 1 mb 1
