// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=400 after-choice=1' | FileCheck %s
// RUN: hp-recompute-opt %s -hpr-bound-weight-deferral='budget=60 after-choice=1' | FileCheck %s --check-prefix=TIGHT
// RUN: sed 's/ fused$//' %s | hp-recompute-opt -hpr-bound-weight-deferral='budget=400 after-choice=1' | FileCheck %s --check-prefix=UNMARKED
// RUN: not hp-recompute-opt %s -hpr-bound-weight-deferral='budget=400 after-choice=1 least-memory=1' 2>&1 | FileCheck %s --check-prefix=BOTH

// Step 6 (after-choice): a pair the least-memory run fused (`fused`) splits
// again with its dw right after the send of its dx's gradient, where that
// backward lies on a critical path: rank 0's backward waits for rank 1's
// gradient, which the dx alone (30 us) sends 22 us sooner than the whole
// backward (52 us). Priced with the checkpoints the module marks.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0.a" checkpoint flops 0.0 time_us 1.0 saved 50 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1.a" checkpoint flops 0.0 time_us 10.0 saved 50 input 1 params 0
    hpr.region "l1.b" checkpoint flops 0.0 time_us 10.0 saved 50 input 1 params 0
  }
}
hpr.schedule "zb" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h1 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0 fused
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// CHECK-LABEL: hpr.program rank 1
// CHECK:       hpr.forward stage 1 mb 0
// CHECK-NEXT:  hpr.backward_input stage 1 mb 0{{$}}
// CHECK-NEXT:  hpr.send_b stage 1 mb 0 peer 0
// CHECK-NEXT:  hpr.backward_weight stage 1 mb 0{{$}}
// CHECK-NEXT:  }

// Split, the dx holds the whole replay (100 bytes); fused, the backward
// replays one region at a time: at 60 bytes the pair stays fused, and the
// mark goes all the same.
// TIGHT-LABEL: hpr.program rank 1
// TIGHT:       hpr.forward stage 1 mb 0
// TIGHT-NEXT:  hpr.backward stage 1 mb 0{{$}}
// TIGHT-NEXT:  hpr.send_b stage 1 mb 0 peer 0

// A backward of the schedule's own (no mark) stays whole.
// UNMARKED-LABEL: hpr.program rank 1
// UNMARKED:       hpr.backward stage 1 mb 0{{$}}
// UNMARKED-NEXT:  hpr.send_b stage 1 mb 0 peer 0

// BOTH: hpr-bound-weight-deferral: after-choice prices the checkpoints the module marks; it does not take least-memory
