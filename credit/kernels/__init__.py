"""Numerical kernels for credit (see ``credit.kernels.gemm``)."""
