"""The real engine: the vLLM plugin, the version facts, the server lifecycle, the benchmark
client, the tiny model.
"""
