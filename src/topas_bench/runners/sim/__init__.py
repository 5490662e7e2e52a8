"""The simulated engine (docs/design.md section 4): an SGLang-faithful event loop and its cost
model."""
