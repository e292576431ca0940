"""What a head folder holds, read from its config.json alone (no weights, no network built).

Contract: ``config_kind(dir)`` is the kind ``load_head`` / ``load_corpus`` would read the folder
as: the kind its ``edgespec`` section names (every layout edgespec writes carries one), else
'medusa' for a Medusa config (``medusa_num_heads``), else 'eagle3' (a published EAGLE-3 or
speculators checkpoint). ``fitting_kind(dir, target)`` is that kind once the sizes the config
states are checked against ``target`` (:class:`HeadError` naming both values when they differ);
a weight file that does not match its own config is named later, when the head is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import HeadError
from .config import HeadConfig

KINDS = ("eagle3", "medusa", "corpus")


def _config(head_dir: Path) -> dict:
    try:
        cfg = json.loads((head_dir / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise HeadError(f"{head_dir}/config.json cannot be read as a head config "
                        f"({type(e).__name__}: {e})") from None
    if not isinstance(cfg, dict):
        raise HeadError(f"{head_dir}/config.json holds {type(cfg).__name__}, not a JSON object")
    return cfg


def _ours(cfg: dict) -> dict:
    ours = cfg.get("edgespec")
    return ours if isinstance(ours, dict) else {}


def config_kind(head_dir) -> str:
    """The kind of the head folder ``head_dir`` ('eagle3', 'medusa' or 'corpus'), from its
    config.json; HeadError when the config cannot be read or names another kind."""
    cfg = _config(Path(head_dir))
    kind = _ours(cfg).get("kind") or ("medusa" if "medusa_num_heads" in cfg else "eagle3")
    if kind not in KINDS:
        raise HeadError(f"head kind {kind!r} ({head_dir}/config.json) is not known; "
                        f"known: {', '.join(KINDS)}")
    return kind


def fitting_kind(head_dir, target) -> str:
    """``config_kind(head_dir)``, after checking the sizes and fingerprint its config states
    against ``target`` (HeadError naming both values unless they fit)."""
    from .corpus import check_corpus, corpus_section

    path = Path(head_dir)
    kind = config_kind(path)
    if kind == "corpus":
        check_corpus(corpus_section(path), target)
        return kind
    stated = _stated(_config(path), kind, path)
    if stated is not None:
        stated.for_layers(target.num_layers).check(target)
    return kind


def _stated(cfg: dict, kind: str, path: Path) -> HeadConfig | None:
    """The HeadConfig the config states without weights: the edgespec section's, else the
    sizes of a published config (None: a Medusa config that states none)."""
    ours = _ours(cfg)
    if "hidden_size" in ours:
        return HeadConfig.from_dict(ours)
    layer = cfg.get("transformer_layer_config", cfg) if kind == "eagle3" else cfg
    sizes = {"hidden_size", "vocab_size"}
    if not isinstance(layer, dict) or (kind == "medusa" and not sizes <= set(layer)):
        return None
    try:
        aux = (cfg.get("eagle_aux_hidden_state_layer_ids")
               or (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or ())
        return HeadConfig(kind=kind, hidden_size=int(layer["hidden_size"]),
                          vocab_size=int(layer["vocab_size"]),
                          aux_layers=tuple(aux) if kind == "eagle3" else ())
    except KeyError as e:
        raise HeadError(f"{path}/config.json lacks {e.args[0]} (an EAGLE-3 config states "
                        f"hidden_size and vocab_size)") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise HeadError(f"{path}/config.json: {type(e).__name__}: {e}") from None
