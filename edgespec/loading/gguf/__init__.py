"""Reading GGUF files: tensors (``tensors.py``, decoded by ``blocks.py``, named per architecture by
``archs.py``) and tokenizer (``tokenizer.py``) apart, joined into a model directory by
``convert.py``."""

from .convert import convert_gguf
from .tensors import CONVERTER_VERSION, SUPPORTED_ARCHITECTURES, SUPPORTED_TYPES, hf_name, permute_rows, read_metadata, unpermute_rows
from .tokenizer import build_tokenizer, tokenizer_files

__all__ = ["CONVERTER_VERSION", "SUPPORTED_ARCHITECTURES", "SUPPORTED_TYPES", "build_tokenizer", "convert_gguf", "hf_name",
           "permute_rows", "read_metadata", "tokenizer_files", "unpermute_rows"]
