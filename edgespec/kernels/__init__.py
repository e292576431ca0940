"""Kernels: one op per file, each with its pure-MLX form and the backend choice beside it.

``backend.py`` says which backend runs (the one place that asks); ``attention.py`` is softmax
attention and the forward-input normalisation it needs; ``activations.py`` is SiLU;
``fused_block.py`` is the fused, compiled decoder block for small inputs; ``matmul.py`` /
``qmatmul.py`` the small-M products of the native CPU kernels (``native/``). The
tree-verification ops (``tree_mask.py`` + ``tree_attention.py``, ``accept.py``, ``compact.py``)
run the Metal kernels of ``kernels_metal/`` (``metal.py``) on a Mac, their emulation on the CPU
when asked (``metal_emulation.py``), else their twins.
"""
