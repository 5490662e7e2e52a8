"""topas-bench: schedulers for multi-agent LLM serving, an SGLang-faithful simulator, benchmarks."""

__version__ = "0.1.0"
