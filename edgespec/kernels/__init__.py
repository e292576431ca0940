"""Kernels: one op per file, each with its pure-MLX form and the backend choice beside it.

``backend.py`` says which backend runs (the one place that asks); ``attention.py`` is softmax
attention and the forward-input normalisation it needs; ``activations.py`` is SiLU;
``fused_block.py`` is the fused, compiled decoder block for small inputs. On Metal and CUDA the
``mx.fast`` kernels are used; custom native kernels land here beside their twins.
"""
