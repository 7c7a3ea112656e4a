// RUN: hp-recompute-opt %s -split-input-file --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-unshard,hpr-verify)))' | FileCheck %s
// RUN: hp-recompute-opt %s -split-input-file --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-unshard{max-active=1},hpr-verify)))' | FileCheck %s --check-prefix=ONE
// RUN: not hp-recompute-opt %s --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-unshard{max-active=0})))' 2>&1 | FileCheck %s --check-prefix=ZERO

// ZERO: error: hpr-insert-unshard: max-active must be >= 1

// Without data parallelism nothing is gathered.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 64
  }
}
// CHECK-LABEL: hpr.schedule "no_data_parallel"
// CHECK-NOT:   hpr.unshard
// CHECK-NOT:   hpr.reshard
// CHECK:       }
hpr.schedule "no_data_parallel" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.recompute %s0
    hpr.backward stage 0 mb 0 session(%s0)
    hpr.clear %s0
    hpr.reduce_grad stage 0
  }
}

// -----

// Two stages on one rank. Within the window (torch's 3 stages) both are
// gathered before the first forward, and each is resharded once no later
// action reads it: stage 1 before the replay of stage 0, stage 0 at the end.
// One stage at a time (max-active=1), a prefetched replay of stage 0 that
// placement moved before stage 1's backward gathers stage 0 again before it.
hpr.model "m" attributes {dp_shard = 2 : i64} {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 64
  }
  hpr.stage 1 {
    hpr.region "l1" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 64
  }
}
// CHECK-LABEL: hpr.schedule "prefetched_replay_is_gathered"
// CHECK:       hpr.unshard stage 0
// CHECK-NEXT:  hpr.unshard stage 1
// CHECK-NEXT:  hpr.forward stage 0 mb 0
// CHECK:       hpr.forward stage 1 mb 0
// CHECK:       hpr.recompute %[[S1:.*]]
// CHECK-NEXT:  hpr.recompute %[[S0:.*]]
// CHECK-NEXT:  hpr.backward stage 1 mb 0 session(%[[S1]])
// CHECK-NEXT:  hpr.clear %[[S1]]
// CHECK-NEXT:  hpr.reduce_grad stage 1
// CHECK-NEXT:  hpr.reshard stage 1
// CHECK-NEXT:  hpr.backward stage 0 mb 0 session(%[[S0]])
// CHECK-NEXT:  hpr.clear %[[S0]]
// CHECK-NEXT:  hpr.reduce_grad stage 0
// CHECK-NEXT:  hpr.reshard stage 0
// CHECK-NEXT:  }
// ONE-LABEL:   hpr.schedule "prefetched_replay_is_gathered"
// ONE:         hpr.unshard stage 0
// ONE-NEXT:    hpr.forward stage 0 mb 0
// ONE:         hpr.reshard stage 0
// ONE-NEXT:    hpr.unshard stage 1
// ONE-NEXT:    hpr.forward stage 1 mb 0
// ONE:         hpr.recompute %[[S1:.*]]
// ONE-NEXT:    hpr.reshard stage 1
// ONE-NEXT:    hpr.unshard stage 0
// ONE-NEXT:    hpr.recompute %[[S0:.*]]
// ONE-NEXT:    hpr.reshard stage 0
// ONE-NEXT:    hpr.unshard stage 1
// ONE-NEXT:    hpr.backward stage 1 mb 0 session(%[[S1]])
hpr.schedule "prefetched_replay_is_gathered" ranks 1 stages 2 microbatches 1 stage_to_rank [0, 0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    %h1 = hpr.forward stage 1 mb 0
    %s1 = hpr.session %h1 as "s1.mb0"
    hpr.recompute %s1
    hpr.recompute %s0
    hpr.backward stage 1 mb 0 session(%s1)
    hpr.clear %s1
    hpr.reduce_grad stage 1
    hpr.backward stage 0 mb 0 session(%s0)
    hpr.clear %s0
    hpr.reduce_grad stage 0
  }
}

// -----

// An overlapped F/B pair reads both its stages: with one stage at a time
// (max-active=1) both are still gathered before the pair, never between its
// halves.
hpr.model "m" attributes {dp_shard = 4 : i64} {
  hpr.stage 0 {
    hpr.region "l0" flops 1.0 time_us 0.0 saved 8 input 1 params 64
  }
  hpr.stage 1 {
    hpr.region "l1" flops 1.0 time_us 0.0 saved 8 input 1 params 64
  }
}
// ONE-LABEL:   hpr.schedule "pair_gathered_before_it"
// ONE:         hpr.forward stage 0 mb 1
// ONE-NEXT:    hpr.reshard stage 0
// ONE-NEXT:    hpr.unshard stage 1
// ONE-NEXT:    hpr.backward stage 1 mb 0
// ONE-NEXT:    hpr.unshard stage 0
// ONE-NEXT:    hpr.forward stage 1 mb 1 overlap
// ONE-NEXT:    hpr.backward stage 0 mb 0 overlap
// ONE-NEXT:    hpr.reshard stage 0
// ONE-NEXT:    hpr.backward stage 1 mb 1
hpr.schedule "pair_gathered_before_it" ranks 1 stages 2 microbatches 2 stage_to_rank [0, 0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %h1 = hpr.forward stage 1 mb 0
    %h2 = hpr.forward stage 0 mb 1
    hpr.backward stage 1 mb 0
    %h3 = hpr.forward stage 1 mb 1 overlap
    hpr.backward stage 0 mb 0 overlap
    hpr.backward stage 1 mb 1
    hpr.backward stage 0 mb 1
  }
}

// -----

// A schedule written with its own unshard and reshard keeps them.
hpr.model "m" attributes {dp_shard = 2 : i64} {
  hpr.stage 0 {
    hpr.region "l0" flops 1.0 time_us 0.0 saved 8 input 1 params 64
  }
}
// CHECK-LABEL: hpr.schedule "written_unshard_kept"
// CHECK:       hpr.unshard stage 0
// CHECK-NEXT:  hpr.forward stage 0 mb 0
// CHECK-NEXT:  hpr.backward stage 0 mb 0
// CHECK-NEXT:  hpr.reshard stage 0
// CHECK-NEXT:  }
hpr.schedule "written_unshard_kept" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    hpr.unshard stage 0
    %h0 = hpr.forward stage 0 mb 0
    hpr.backward stage 0 mb 0
    hpr.reshard stage 0
  }
}

// -----

// As torch's lowering: the unshard goes above the receive its forward reads,
// but not into a batched run of transfers.
hpr.model "m" attributes {dp_shard = 2 : i64} {
  hpr.stage 0 {
    hpr.region "l0" flops 1.0 time_us 0.0 saved 8 input 1 params 64
  }
  hpr.stage 1 {
    hpr.region "l1" flops 1.0 time_us 0.0 saved 8 input 1 params 64
  }
}
// CHECK-LABEL: hpr.schedule "unshard_above_receive"
// CHECK:       hpr.program rank 1
// CHECK-NEXT:  hpr.unshard stage 1
// CHECK-NEXT:  hpr.recv_f stage 1 mb 0 peer 0
// CHECK-NEXT:  hpr.forward stage 1 mb 0
hpr.schedule "unshard_above_receive" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h1 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// -----

hpr.model "m" attributes {dp_shard = 2 : i64} {
  hpr.stage 0 {
    hpr.region "l0" flops 1.0 time_us 0.0 saved 8 input 1 params 64
  }
  hpr.stage 1 {
    hpr.region "l1" flops 1.0 time_us 0.0 saved 8 input 1 params 64
  }
}
// CHECK-LABEL: hpr.schedule "unshard_after_batched_run"
// CHECK:       hpr.program rank 1
// CHECK-NEXT:  hpr.recv_f stage 1 mb 0 peer 0 batched
// CHECK-NEXT:  hpr.recv_f stage 1 mb 1 peer 0
// CHECK-NEXT:  hpr.unshard stage 1
// CHECK-NEXT:  hpr.forward stage 1 mb 0
hpr.schedule "unshard_after_batched_run" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %h1 = hpr.forward stage 0 mb 1
    hpr.send_f stage 0 mb 0 peer 1 batched
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
    hpr.recv_b stage 0 mb 1 peer 1
    hpr.backward stage 0 mb 1
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0 batched
    hpr.recv_f stage 1 mb 1 peer 0
    %h2 = hpr.forward stage 1 mb 0
    %h3 = hpr.forward stage 1 mb 1
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    hpr.backward stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
  }
}
