"""Specs at a Git revision: the glue between the Git source and the spec loader."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from reconciler.source.git import GitSource
from reconciler.spec.load import SPEC_SUFFIXES, LoadResult, load_files
from reconciler.spec.policy import SpecPolicy

T = TypeVar("T")


def spec_paths(files: Mapping[str, T]) -> dict[str, T]:
    """Hidden files and folders (.github/, .gitlab-ci.yml) are never specs."""
    return {p: d for p, d in files.items() if not (p.startswith(".") or "/." in p)}


def load_at(source: GitSource, rev: str, subdir: str = "", *, policy: SpecPolicy = SpecPolicy.RESTRICTED) -> LoadResult:
    return load_files(spec_paths(source.read_tree(rev, subdir, SPEC_SUFFIXES)), policy=policy)
