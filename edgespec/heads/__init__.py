"""Trained drafting heads (layer 3, "models"): EAGLE-3 and Medusa, their configs, the file formats
they are shipped in, and where a target's head is found.

- ``config.py``: ``HeadConfig``, ``fingerprint(target)``, ``check`` (HeadError on a mismatch);
- ``eagle3.py``: ``Eagle3Head`` (``fuse``, ``step`` over its own KVCache, ``unroll``: the
  training-time test), ``eagle3_loss``;
- ``medusa.py``: ``MedusaHeads``, ``medusa_loss``;
- ``formats.py``: ``save_head`` / ``load_head`` (ours, EAGLE-3 ``midlayer.*`` / ``layers.0.*``,
  Medusa);
- ``find.py``: ``find_head(target, kind)``;
- ``kind.py``: a head folder's kind and the sizes it states, from its config.json alone;
- ``loaded.py``: ``load_head_for`` (a target's head, loaded once), ``head_kinds``,
  ``head_in_bits``.
"""

from .config import HeadConfig, fingerprint
from .eagle3 import Eagle3Head, depth_mask, eagle3_loss
from .find import find_head, head_kind
from .formats import load_head, save_head
from .medusa import MedusaHeads, medusa_loss, target_lm_head

__all__ = ["Eagle3Head", "HeadConfig", "MedusaHeads", "depth_mask", "eagle3_loss", "find_head",
           "fingerprint", "head_kind", "load_head", "medusa_loss", "save_head", "target_lm_head"]
