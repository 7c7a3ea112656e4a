// A two-rank ZBV-shaped schedule (stages 0 and 3 on rank 0, 1 and 2 on
// rank 1) for two microbatches, before recompute planning. Every stage has
// one checkpointed block.
module {
  hpr.model "tiny" {
    hpr.stage 0 {
      hpr.region "embed" non_checkpointable flops 1.0e3 time_us 0.0 saved 64 input 0 params 256
      hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
    }
    hpr.stage 1 {
      hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
    }
    hpr.stage 2 {
      hpr.region "layers.2" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
    }
    hpr.stage 3 {
      hpr.region "layers.3" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
    }
  }
  hpr.schedule "zbv" ranks 2 stages 4 microbatches 2 stage_to_rank [0, 1, 1, 0] {
    hpr.program rank 0 {
      %h0 = hpr.forward stage 0 mb 0
      hpr.send_f stage 0 mb 0 peer 1
      %h1 = hpr.forward stage 0 mb 1
      hpr.send_f stage 0 mb 1 peer 1
      hpr.recv_f stage 3 mb 0 peer 1
      %h2 = hpr.forward stage 3 mb 0
      hpr.backward_input stage 3 mb 0
      hpr.backward_weight stage 3 mb 0
      hpr.send_b stage 3 mb 0 peer 1
      hpr.recv_f stage 3 mb 1 peer 1
      %h3 = hpr.forward stage 3 mb 1
      hpr.backward_input stage 3 mb 1
      hpr.send_b stage 3 mb 1 peer 1
      hpr.recv_b stage 0 mb 0 peer 1
      hpr.backward_input stage 0 mb 0
      hpr.backward_weight stage 3 mb 1
      hpr.recv_b stage 0 mb 1 peer 1
      hpr.backward_input stage 0 mb 1
      hpr.backward_weight stage 0 mb 0
      hpr.backward_weight stage 0 mb 1
    }
    hpr.program rank 1 {
    }
  }
}
