"""What the Triton and CuPy entry points need: materialized copies, CuPy's NVRTC flag translation."""
