"""specverify inside serving engines: one sub-package per engine (vllm/: the vLLM plug-in)."""
