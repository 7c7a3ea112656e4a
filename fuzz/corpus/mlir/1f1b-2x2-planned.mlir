module {
  hpr.model "uniform" {
    hpr.stage 0 {
      hpr.region "stage0" checkpoint flops 0.000000e+00 time_us 1.000000e+00 saved 1 input 0 params 0
    }
    hpr.stage 1 {
      hpr.region "stage1" checkpoint flops 0.000000e+00 time_us 1.000000e+00 saved 1 input 0 params 0
    }
  }
  hpr.schedule "1f1b" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
    hpr.program rank 0 attributes {compute_order = array<i64: 0, 0, 0, 0, 0, 1, 3, 0, 0, 3, 0, 1>} {
      %h0.mb0 = hpr.forward stage 0 mb 0
      %s0.mb0 = hpr.session %h0.mb0 as "s0.mb0"
      hpr.send_f stage 0 mb 0 peer 1
      %h0.mb1 = hpr.forward stage 0 mb 1
      %s0.mb1 = hpr.session %h0.mb1 as "s0.mb1"
      hpr.send_f stage 0 mb 1 peer 1
      hpr.recv_b stage 0 mb 0 peer 1
      hpr.recompute %s0.mb0
      hpr.backward stage 0 mb 0 session(%s0.mb0)
      hpr.clear %s0.mb0
      hpr.recv_b stage 0 mb 1 peer 1
      hpr.recompute %s0.mb1
      hpr.backward stage 0 mb 1 session(%s0.mb1)
      hpr.clear %s0.mb1
    }
    hpr.program rank 1 attributes {compute_order = array<i64: 0, 1, 0, 3, 1, 0, 0, 1, 1, 3, 1, 1>} {
      hpr.recv_f stage 1 mb 0 peer 0
      %h1.mb0 = hpr.forward stage 1 mb 0
      %s1.mb0 = hpr.session %h1.mb0 as "s1.mb0"
      hpr.recompute %s1.mb0
      hpr.backward stage 1 mb 0 session(%s1.mb0)
      hpr.clear %s1.mb0
      hpr.send_b stage 1 mb 0 peer 0
      hpr.recv_f stage 1 mb 1 peer 0
      %h1.mb1 = hpr.forward stage 1 mb 1
      %s1.mb1 = hpr.session %h1.mb1 as "s1.mb1"
      hpr.recompute %s1.mb1
      hpr.backward stage 1 mb 1 session(%s1.mb1)
      hpr.clear %s1.mb1
      hpr.send_b stage 1 mb 1 peer 0
    }
  }
}
