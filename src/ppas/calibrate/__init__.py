"""Step logs in, cost models out: fitting and live profiling."""
