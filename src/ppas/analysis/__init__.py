"""Results: run statistics, sweep tables, the paper reference, plots."""
