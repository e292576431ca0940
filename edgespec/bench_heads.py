"""``edgespec bench``'s head variants: ``METHOD@HEAD`` runs a method that reads a trained head
with the head named after the ``@``, so one run compares heads (the shipped one against the one
learned from the user, two trained folders) on the same prompts, against the same baseline.

Contract: HEAD is ``shipped`` (the head found without learned heads), ``learned`` (the head
rolled out from learning) or a head folder, resolved by ``heads.learned.resolve_alias``. METHOD
is any method whose ``methods.Method.reads`` has ``head``; it reads a head of its own name's
kind (eagle3, medusa, corpus), ``auto`` an eagle3 head (its EAGLE-3 arm's). A variant's name is
the whole string: it is a method of its own in the report. ``split`` checks a name without a
model (the CLI checks before it loads one); ``resolve`` turns each variant's HEAD into a folder,
once per run; ``heads_used`` is the folder every head-reading method of a run drafts with (the
report's ``env["heads"]``); ``labels`` shortens a folder after the ``@`` to the tail of its path
that tells the run's variants apart, for tables and plots (the JSON keeps the whole path).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path, PurePath

from . import methods
from .errors import ConfigError

SEP = "@"
ALIASES = ("shipped", "learned")


def head_kind(method: str) -> str:
    """The kind of head ``method`` reads: its own name's (eagle3, medusa, corpus); auto's
    EAGLE-3 arm reads an eagle3 head."""
    from .heads.kind import KINDS

    return method if method in KINDS else "eagle3"


def split(name: str) -> tuple[str, str | None]:
    """(method, HEAD) of a bench method name ``METHOD@HEAD``, (name, None) of a plain one;
    ConfigError naming the bad value and what is allowed when METHOD is unknown or reads no
    head, or HEAD is empty."""
    method, at, alias = name.partition(SEP)
    if not at:
        return name, None
    readers = methods.readers("head")
    if method not in methods.NAMES or method not in readers:
        what = "is not a method" if method not in methods.NAMES else "reads no head"
        raise ConfigError(f"{name!r}: {method!r} {what}; METHOD@HEAD takes a method that reads "
                          f"a head: {', '.join(readers)}")
    if not alias.strip():
        raise ConfigError(f"{name!r} names no head after {SEP!r}; give "
                          f"{' or '.join(map(repr, ALIASES))} or a head folder")
    return method, alias


def resolve(names: Iterable[str], target) -> dict[str, Path]:
    """Each variant's head folder (absolute), every alias resolved once: variant name -> folder.
    Plain names are left out. ConfigError when an alias names no head (``resolve_alias``)."""
    from .heads.learned import resolve_alias

    folders: dict[tuple[str, str], Path] = {}
    out = {}
    for name in names:
        method, alias = split(name)
        if alias is None:
            continue
        key = (alias, head_kind(method))
        if key not in folders:
            folders[key] = resolve_alias(alias, target, key[1]).resolve()
        out[name] = folders[key]
    return out


def heads_used(specs: Mapping, target) -> dict[str, str | None]:
    """method name -> the head folder its SpecConfig drafts with, for every method in ``specs``
    that reads a head: the one given (a variant's, or ``--head``), else the one ``find_head``
    finds for ``target`` (None: none found)."""
    from .heads.find import find_head

    out = {}
    for name, spec in specs.items():
        if "head" not in methods.get(spec.method).reads:
            continue
        path = spec.head if spec.head is not None else find_head(target, head_kind(spec.method))
        out[name] = None if path is None else str(Path(path).resolve())
    return out


def labels(names: Iterable[str]) -> dict[str, str]:
    """name -> the name shown in tables and plots: ``METHOD@FOLDER`` with a folder path cut to
    the shortest tail that no other variant of the same method shares (``eagle3@…/v2/eagle3``);
    every other name as it is. Pure: names need not be checked."""
    names = list(names)
    paths = {n: (n.partition(SEP)[0], PurePath(n.partition(SEP)[2]).parts) for n in names
             if SEP in n and "/" in n.partition(SEP)[2]}
    out = {n: n for n in names}
    for name, (method, parts) in paths.items():
        for k in range(1, len(parts)):
            if sum(m == method and p[-k:] == parts[-k:] for m, p in paths.values()) == 1:
                out[name] = f"{method}{SEP}…/{'/'.join(parts[-k:])}"
                break
    return out
