// Two ranks, one stage on rank 0: rank 1's program has no actions
// (hpr-verify-comm refuses it; hpr-select-checkpoints must not crash on it).
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" flops 0.0 time_us 10.0 saved 100 input 1 params 0
  }
}
hpr.schedule "idle_rank" ranks 2 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
  }
}
