// A misspelt action.
hpr.schedule "s" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
      hpr.fordward stage 0 mb 0
  }
}
