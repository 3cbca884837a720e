"""The shared vocabulary every stage speaks: the scheduler view, decisions, records (metrics,
the step log), config parsing, errors, limits, the registry, safe outputs.
"""
