"""Loading: resolving a model reference (``hub.py``), tokenizers and chat templates
(``tokenizer.py``), GGUF files (``gguf/``) and, on Linux, the BLAS MLX binds to (``_blas.py``).

Nothing here imports ``mlx`` at package import: ``_blas`` must run before MLX is loaded.
"""
