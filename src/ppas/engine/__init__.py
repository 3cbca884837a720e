"""One engine stepped like vLLM: the step rules both engines apply, the simulator, the prefix
cache.
"""
