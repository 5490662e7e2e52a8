"""The simulated engine (DESIGN section 4): an SGLang-faithful event loop and its cost model."""
