"""What runs a model: the `LanguageModel` protocol (base), its engines (transformers: hf, llama.cpp:
llamacpp), tree attention, and finding, loading and caching real models (loading, model_cache, chat)."""
