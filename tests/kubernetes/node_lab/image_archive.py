"""Writes a container image as a `docker save` archive (what `ctr images import` loads) from layer tarballs
the caller made, so the node lab needs no registry and no Docker. The archive holds `manifest.json`, the
image config (`<sha256>.json`) and one uncompressed tar per layer (`<sha256>/layer.tar`); layers are
streamed, never read into memory whole.

    python -m tests.kubernetes.node_lab.image_archive OUT.tar --tag NAME:TAG [--tag ...] --layer A.tar --layer B.tar \
        [--entrypoint '["/docker-entrypoint.sh"]'] [--cmd '["help"]'] [--env K=V ...] [--workdir DIR] [--user UID]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class ImageConfig:
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    workdir: str = ""
    user: str = ""


def write_archive(out: Path, tags: list[str], layers: list[Path], config: ImageConfig) -> str:
    """Write the archive; returns the image id (sha256 of its config)."""
    digests = [sha256_file(p) for p in layers]
    cfg: dict[str, object] = {
        "architecture": "amd64", "os": "linux",
        "config": {k: v for k, v in (("Entrypoint", config.entrypoint), ("Cmd", config.cmd),
                                     ("Env", config.env), ("WorkingDir", config.workdir),
                                     ("User", config.user)) if v},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in digests]},
        "history": [{"created_by": f"layer {p.name}"} for p in layers],
    }
    cfg_bytes = json.dumps(cfg, sort_keys=True).encode()
    image_id = hashlib.sha256(cfg_bytes).hexdigest()
    manifest = [{"Config": f"{image_id}.json", "RepoTags": tags,
                 "Layers": [f"{d}/layer.tar" for d in digests]}]
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, f"{image_id}.json", cfg_bytes)
        for digest, path in zip(digests, layers, strict=True):
            tar.add(path, arcname=f"{digest}/layer.tar")
        _add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
    return image_id


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("out", type=Path)
    p.add_argument("--tag", action="append", required=True)
    p.add_argument("--layer", type=Path, action="append", required=True)
    p.add_argument("--entrypoint", default="[]")
    p.add_argument("--cmd", default="[]")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--workdir", default="")
    p.add_argument("--user", default="")
    a = p.parse_args(argv)
    image_id = write_archive(a.out, a.tag, a.layer, ImageConfig(json.loads(a.entrypoint), json.loads(a.cmd),
                                                                a.env, a.workdir, a.user))
    print(f"{a.out}: {' '.join(a.tag)} sha256:{image_id}")


if __name__ == "__main__":
    main()
