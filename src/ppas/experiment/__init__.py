"""``ppas experiment``: live comparisons on a real engine (spec, plan, runner, report)."""
