// RUN: hp-recompute-opt %s -split-input-file --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-recompute)),hpr-prefetch-into-bubbles)' | FileCheck %s --check-prefix=PEAK
// RUN: hp-recompute-opt %s -split-input-file --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-recompute)),hpr-prefetch-into-bubbles{budget=1000})' | FileCheck %s --check-prefix=ROOMY
// RUN: not hp-recompute-opt %s --pass-pipeline='builtin.module(hpr-prefetch-into-bubbles{budget=-1})' 2>&1 | FileCheck %s --check-prefix=NEGATIVE
// RUN: not hp-recompute-opt %s -hpr-recompute-pipeline='policy=jit distance=2' 2>&1 | FileCheck %s --check-prefix=DISTANCE
// RUN: not hp-recompute-opt %s -hpr-recompute-pipeline='policy=lookahead deferral-budget=5' 2>&1 | FileCheck %s --check-prefix=BUDGET
// RUN: not hp-recompute-opt %s -hpr-recompute-pipeline='policy=jit placement=critical' 2>&1 | FileCheck %s --check-prefix=PLACEMENT
// RUN: not hp-recompute-opt %s -hpr-recompute-pipeline='policy=bubble select=auto budget=5 placement=every-fit' 2>&1 | FileCheck %s --check-prefix=PLACEMENT

// GPipe on two ranks, F = 10 us, B = 26 us (dx/dw ratios), replay 10 us.
// Under jit, rank 0 idles from t=20 (its forwards done) to t=66, when the
// gradient of mb 0 arrives; its replays keep 100 bytes each, the forwards 1.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 0.0 time_us 10.0 saved 100 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1" checkpoint flops 0.0 time_us 10.0 saved 100 input 1 params 0
  }
}
hpr.schedule "gpipe" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    %s1 = hpr.session %h1 as "s0.mb1"
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0 session(%s0)
    hpr.recv_b stage 0 mb 1 peer 1
    hpr.backward stage 0 mb 1 session(%s1)
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h2 = hpr.forward stage 1 mb 0
    %s2 = hpr.session %h2 as "s1.mb0"
    hpr.recv_f stage 1 mb 1 peer 0
    %h3 = hpr.forward stage 1 mb 1
    %s3 = hpr.session %h3 as "s1.mb1"
    hpr.backward stage 1 mb 0 session(%s2)
    hpr.send_b stage 1 mb 0 peer 0
    hpr.backward stage 1 mb 1 session(%s3)
    hpr.send_b stage 1 mb 1 peer 0
  }
}

// Within the jit peak (102 bytes on rank 0): mb 0 replays while rank 0
// waits, and having moved it replays whole, not inside its backward; mb 1
// replays whole too, in the wait for its gradient right after B0: it would
// hold 100 more bytes over B0, but B0 is done with mb 0's replay by then, so
// from there it meets only what mb 1's forward keeps (101 bytes).
// Rank 1 never waits between its forward and its backward.
// PEAK:      hpr.send_f stage 0 mb 1
// PEAK-NEXT: hpr.recompute %s0.mb0{{$}}
// PEAK-NEXT: hpr.recv_b stage 0 mb 0
// PEAK-NEXT: hpr.backward stage 0 mb 0
// PEAK-NEXT: hpr.recompute %s0.mb1{{$}}
// PEAK-NEXT: hpr.recv_b stage 0 mb 1
// PEAK-NEXT: hpr.backward stage 0 mb 1
// PEAK:      %s1.mb1 = hpr.session
// PEAK-NEXT: hpr.recompute %s1.mb0 {in_backward}
// PEAK-NEXT: hpr.backward stage 1 mb 0

// With room, both fit the 46 us gap; the later consumer is placed first,
// and the earlier one after it, nearer its reader.
// ROOMY:      hpr.send_f stage 0 mb 1
// ROOMY-NEXT: hpr.recompute %s0.mb1{{$}}
// ROOMY-NEXT: hpr.recompute %s0.mb0{{$}}
// ROOMY-NEXT: hpr.recv_b stage 0 mb 0

// The pipeline refuses what none of its passes would read.
// DISTANCE: hpr-recompute-pipeline: distance applies to policy=lookahead only
// BUDGET: hpr-recompute-pipeline: deferral-budget must be between 0 and budget, got 5
// PLACEMENT: hpr-recompute-pipeline: placement applies to policy=bubble with select=model only
// NEGATIVE: error: hpr-prefetch-into-bubbles: budget must be >= 0, got -1

// -----

// The same GPipe with two regions in stage 0 (100 bytes each). Inside its
// backward a replay holds one region at a time: rank 0's jit peak is 104
// bytes (both microbatches' 2 inputs and one region). Moved into the gap,
// mb 0's replay would hold both regions, 200 bytes, from there on: within
// the jit peak it cannot move whole, but its last region can (a piece: 100
// bytes held up to the backward, which reads it first and drops it before
// it replays l0), and the rest replays inside the backward; so can mb 1's,
// right after B0, which is done with mb 0's tensors by then (2 inputs and a
// region: 102 bytes); with room it moves whole.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 0.0 time_us 5.0 saved 100 input 1 params 0
    hpr.region "l1" checkpoint flops 0.0 time_us 5.0 saved 100 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l2" checkpoint flops 0.0 time_us 10.0 saved 100 input 1 params 0
  }
}
hpr.schedule "gpipe_two_regions" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    %s1 = hpr.session %h1 as "s0.mb1"
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0 session(%s0)
    hpr.recv_b stage 0 mb 1 peer 1
    hpr.backward stage 0 mb 1 session(%s1)
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h2 = hpr.forward stage 1 mb 0
    %s2 = hpr.session %h2 as "s1.mb0"
    hpr.recv_f stage 1 mb 1 peer 0
    %h3 = hpr.forward stage 1 mb 1
    %s3 = hpr.session %h3 as "s1.mb1"
    hpr.backward stage 1 mb 0 session(%s2)
    hpr.send_b stage 1 mb 0 peer 0
    hpr.backward stage 1 mb 1 session(%s3)
    hpr.send_b stage 1 mb 1 peer 0
  }
}

// PEAK-LABEL: hpr.schedule "gpipe_two_regions"
// PEAK:       hpr.send_f stage 0 mb 1
// PEAK-NEXT:  hpr.recompute %s0.mb0 {regions = array<i64: 1>}
// PEAK-NEXT:  hpr.recv_b stage 0 mb 0
// PEAK-NEXT:  hpr.recompute %s0.mb0 {in_backward, regions = array<i64: 0>}
// PEAK-NEXT:  hpr.backward stage 0 mb 0
// PEAK-NEXT:  hpr.recompute %s0.mb1 {regions = array<i64: 1>}
// PEAK-NEXT:  hpr.recv_b stage 0 mb 1
// PEAK-NEXT:  hpr.recompute %s0.mb1 {in_backward, regions = array<i64: 0>}
// ROOMY-LABEL: hpr.schedule "gpipe_two_regions"
// ROOMY:       hpr.send_f stage 0 mb 1
// ROOMY-NEXT:  hpr.recompute %s0.mb1{{$}}
// ROOMY-NEXT:  hpr.recompute %s0.mb0{{$}}
// ROOMY-NEXT:  hpr.recv_b stage 0 mb 0

// -----

// A replay longer than the gap before it (rank 0 waits 4.6 us for the
// gradient, the replay takes 10): with only the receive between, it moves
// there anyway, delays nobody else, and its backward starts 4.6 us earlier.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 0.0 time_us 10.0 saved 100 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1" checkpoint flops 0.0 time_us 1.0 saved 100 input 1 params 0
  }
}
hpr.schedule "outlasts_its_gap" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.send_f stage 0 mb 0 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0 session(%s0)
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h1 = hpr.forward stage 1 mb 0
    %s1 = hpr.session %h1 as "s1.mb0"
    hpr.backward stage 1 mb 0 session(%s1)
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// PEAK-LABEL: hpr.schedule "outlasts_its_gap"
// PEAK:       hpr.send_f stage 0 mb 0
// PEAK-NEXT:  hpr.recompute %s0.mb0{{$}}
// PEAK-NEXT:  hpr.recv_b stage 0 mb 0
// PEAK-NEXT:  hpr.backward stage 0 mb 0

// -----

// The same wait on rank 0, but off the critical path: rank 1's dw (500 us)
// ends the step long after rank 0's backward. Moved, rank 0's replay would
// shorten nothing and hold its bytes longer: it stays inside its backward,
// within the jit peak and with room alike.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 0.0 time_us 10.0 saved 100 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1" checkpoint flops 0.0 time_us 1.0 saved 100 input 1 params 0 {bwd_weight_time_us = 500.0 : f64}
  }
}
hpr.schedule "off_the_critical_path" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.send_f stage 0 mb 0 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0 session(%s0)
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h1 = hpr.forward stage 1 mb 0
    %s1 = hpr.session %h1 as "s1.mb0"
    hpr.backward_input stage 1 mb 0 session(%s1)
    hpr.send_b stage 1 mb 0 peer 0
    hpr.backward_weight stage 1 mb 0
  }
}

// PEAK-LABEL: hpr.schedule "off_the_critical_path"
// PEAK:       hpr.send_f stage 0 mb 0
// PEAK-NEXT:  hpr.recv_b stage 0 mb 0
// PEAK-NEXT:  hpr.recompute %s0.mb0 {in_backward}
// PEAK-NEXT:  hpr.backward stage 0 mb 0
// ROOMY-LABEL: hpr.schedule "off_the_critical_path"
// ROOMY:       hpr.send_f stage 0 mb 0
// ROOMY-NEXT:  hpr.recv_b stage 0 mb 0
// ROOMY-NEXT:  hpr.recompute %s0.mb0 {in_backward}
// ROOMY-NEXT:  hpr.backward stage 0 mb 0

// -----

// FSDP: the GPipe programs above with stage 0's parameters resharded after
// its forwards and gathered again after the gradient of mb 0 arrives. The
// replay of mb 0 would fill the wait before that receive, but there it
// would read sharded parameters: it stays inside the window, and with no
// idle time there, inside its backward.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 0.0 time_us 10.0 saved 100 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1" checkpoint flops 0.0 time_us 10.0 saved 100 input 1 params 0
  }
}
// PEAK-LABEL: hpr.schedule "gpipe_window"
// PEAK:      hpr.reshard stage 0
// PEAK-NEXT: hpr.recv_b stage 0 mb 0
// PEAK-NEXT: hpr.unshard stage 0
// PEAK-NEXT: hpr.recompute %s0.mb0 {in_backward}
// PEAK-NEXT: hpr.backward stage 0 mb 0
hpr.schedule "gpipe_window" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    hpr.unshard stage 0
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    %s1 = hpr.session %h1 as "s0.mb1"
    hpr.send_f stage 0 mb 1 peer 1
    hpr.reshard stage 0
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.unshard stage 0
    hpr.backward stage 0 mb 0 session(%s0)
    hpr.recv_b stage 0 mb 1 peer 1
    hpr.backward stage 0 mb 1 session(%s1)
    hpr.reshard stage 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h2 = hpr.forward stage 1 mb 0
    %s2 = hpr.session %h2 as "s1.mb0"
    hpr.recv_f stage 1 mb 1 peer 0
    %h3 = hpr.forward stage 1 mb 1
    %s3 = hpr.session %h3 as "s1.mb1"
    hpr.backward stage 1 mb 0 session(%s2)
    hpr.send_b stage 1 mb 0 peer 0
    hpr.backward stage 1 mb 1 session(%s3)
    hpr.send_b stage 1 mb 1 peer 0
  }
}
