# src/kernels fragment
