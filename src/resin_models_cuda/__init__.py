"""Optimized NVIDIA GPU runners: Triton kernels, CUDA graphs."""
