"""Models by name: Hugging Face repositories (llama.cpp's `-hf OWNER/REPO[:QUANT]`) and URLs.

Everything about the Hub goes through `huggingface_hub`: its cache (`HF_HOME` /
`HF_HUB_CACHE`, shared with every other tool that uses it), resumable downloads, `HF_ENDPOINT`,
`HF_TOKEN` and offline mode (`HF_HUB_OFFLINE=1`); those variables are the library's, read by
the library. What is ours is llama.cpp's rule for picking a file of a repository:

- `:QUANT` given: the first GGUF model file (not an mmproj / imatrix side file) whose path
  contains QUANT followed by `.` or `-`, case-insensitive (`:q4_1` finds `model-Q4_1.gguf`);
- none given: Q4_K_M, else Q8_0, else the first GGUF model file;
- `-hff FILE` names the file exactly (case-insensitive), as llama.cpp's `--hf-file`.

The file list comes from the Hub; when the Hub cannot be reached (or offline mode is on) it
comes from the cache, so a model fetched once runs again with no network. A plain
`http(s)://.../x.gguf` URL downloads once into `cache_dir()/urls/` (resumed from a `.part` file).
`huggingface_hub` is imported only when a model is fetched, listed or removed.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from .config import cache_dir
from .errors import MinferError

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp's order when no :QUANT is given
SIDE_FILES = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # GGUFs that are not a model
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TAG = re.compile(r"^[A-Za-z0-9_.-]+$")
_SPLIT = re.compile(r"^(.+)-(\d{5})-of-(\d{5})\.gguf$", re.I)


@dataclass(frozen=True)
class HFRef:
    """`OWNER/REPO[:QUANT]`: a repository and the quant to pick in it (None: the default order)."""

    repo: str
    tag: str | None = None

    @classmethod
    def parse(cls, text: str) -> HFRef:
        repo, _, tag = text.strip().partition(":")
        if not _REPO.match(repo) or (tag and not _TAG.match(tag)):
            raise MinferError(f"expected a Hugging Face model as OWNER/REPO[:QUANT] (e.g. "
                              f"bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M), got {text!r}")
        return cls(repo, tag or None)

    def __str__(self) -> str:
        return self.repo + (f":{self.tag}" if self.tag else "")


def is_url(text: str) -> bool:
    return text.startswith(("https://", "http://"))


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.lower().endswith(".gguf") and not any(s in name for s in SIDE_FILES)


def pick_file(files: list[str], tag: str | None) -> str:
    """The file llama.cpp's `-hf REPO[:tag]` would take (module docstring); MinferError listing
    the repository's GGUF files when nothing matches."""
    for t in (tag,) if tag else DEFAULT_QUANTS:
        pattern = re.compile(re.escape(t) + r"[.-]", re.I)
        for f in files:
            if is_model_file(f) and pattern.search(f) and _split_index(f) in (None, 1):
                return f
    if not tag:
        for f in files:
            if is_model_file(f) and _split_index(f) in (None, 1):
                return f
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    what = f"no GGUF file for quant {tag!r}" if tag else "no GGUF model file"
    raise MinferError(f"{what} in the repository; its GGUF files: {', '.join(ggufs) or 'none'}")


def _split_index(path: str) -> int | None:
    m = _SPLIT.match(path)
    return int(m.group(2)) if m else None


def _check_whole(path: str) -> None:
    m = _SPLIT.match(path)
    if m and int(m.group(3)) > 1:
        raise MinferError(f"{path} is part 1 of a model split into {int(m.group(3))} files; minfer reads "
                          "single-file GGUFs (join them with llama.cpp's llama-gguf-split --merge)")


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _cached_files(repo: str) -> list[str]:
    """The files of the repository's cached snapshot (its `main` ref, else the newest)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir()
    except CacheNotFound:
        return []
    for r in info.repos:
        if r.repo_type == "model" and r.repo_id == repo:
            revs = sorted(r.revisions, key=lambda v: ("main" in v.refs, v.last_modified), reverse=True)
            if revs:
                root = revs[0].snapshot_path
                return sorted(f.file_path.relative_to(root).as_posix() for f in revs[0].files)
    return []


def _repo_files(repo: str, token: str | None) -> tuple[list[str], bool]:
    """(the repository's file list, whether it came from the Hub) — the cache's when the Hub
    is unreachable or offline mode is on."""
    from huggingface_hub import list_repo_files
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if not _offline():
        try:
            return list_repo_files(repo, token=token), True
        except GatedRepoError:
            raise MinferError(f"{repo} is gated: accept its terms on the Hub and pass a token "
                              "(HF_TOKEN or -hft/--hf-token)") from None
        except RepositoryNotFoundError:
            raise MinferError(f"no model repository {repo} on the Hub (or it is private: pass a token with "
                              "HF_TOKEN or -hft/--hf-token)") from None
        except Exception as e:  # noqa: BLE001 (unreachable, or an HTTP error: the cache may still serve)
            if not _cached_files(repo):
                raise MinferError(f"cannot list {repo} on the Hub ({type(e).__name__}: {e}) and nothing of it "
                                  "is cached") from None
    files = _cached_files(repo)
    if not files:
        raise MinferError(f"{repo} is not in the cache and offline mode is on (HF_HUB_OFFLINE)")
    return files, False


def fetch(ref: str | HFRef, *, file: str | None = None, token: str | None = None, progress: bool = True) -> Path:
    """The local path of a repository's model file, downloaded into the Hub cache if absent
    (or stale, while the Hub is reachable)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    ref = HFRef.parse(ref) if isinstance(ref, str) else ref
    files, online = _repo_files(ref.repo, token)
    if file is not None:
        hits = [f for f in files if f.lower() == file.lower()]
        if not hits:
            raise MinferError(f"-hff/--hf-file {file}: not in {ref.repo}; its GGUF files: "
                              f"{', '.join(f for f in files if f.lower().endswith('.gguf')) or 'none'}")
        name = hits[0]
    else:
        name = pick_file(files, ref.tag)
    _check_whole(name)
    kw = {} if progress else {"tqdm_class": _Silent}
    try:
        return Path(hf_hub_download(ref.repo, name, token=token, local_files_only=not online, **kw))
    except (EntryNotFoundError, LocalEntryNotFoundError) as e:
        raise MinferError(f"{ref.repo}/{name}: cannot be downloaded or found in the cache: {e}") from None


class _Silent:
    """A tqdm stand-in that shows nothing (progress off: not a terminal)."""

    def __init__(self, *a, **kw):
        self.n = 0

    def update(self, n=1):
        self.n += n

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


# ---------------------------------------------------------------------- URLs
def url_path(url: str) -> Path:
    """Where a URL's file lives in minfer's cache: urls/<hash of the URL>/<its file name>."""
    name = Path(urllib.parse.urlsplit(url).path).name or "model.gguf"
    return cache_dir() / "urls" / hashlib.sha256(url.encode()).hexdigest()[:16] / name


def fetch_url(url: str, *, token: str | None = None, progress: bool = True) -> Path:
    """Download a URL once (a `.part` file resumes an interrupted download); the cached copy after."""
    import urllib.error  # (here: a run of a local file does not import http.client and ssl)
    import urllib.request

    dest = url_path(url)
    if dest.is_file():
        return dest
    if not urllib.parse.urlsplit(url).path.lower().endswith(".gguf"):
        raise MinferError(f"-m/--model {url}: a model URL names a .gguf file")
    dest.parent.mkdir(parents=True, exist_ok=True)
    (dest.parent / "url").write_text(url + "\n", encoding="utf-8")
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"User-Agent": "minfer"})
    if have:
        req.add_header("Range", f"bytes={have}-")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            if have and r.status != 206:  # the server ignored the range: start over
                have = 0
            total = have + int(r.headers.get("Content-Length") or 0)
            from tqdm import tqdm

            with part.open("ab" if have else "wb") as f, tqdm(total=total or None, initial=have, unit="B",
                                                               unit_scale=True, desc=dest.name,
                                                               disable=not progress, leave=False) as bar:
                while chunk := r.read(1 << 20):
                    f.write(chunk)
                    bar.update(len(chunk))
    except urllib.error.HTTPError as e:
        raise MinferError(f"downloading {url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise MinferError(f"downloading {url} failed ({e}); run again to resume") from None
    part.replace(dest)
    return dest


# ---------------------------------------------------------------------- list / rm
@dataclass(frozen=True)
class CachedModel:
    """One GGUF model file in a cache: how to name it again, where it is, its size."""

    name: str  # OWNER/REPO/FILE or the URL
    path: Path
    size: int


def cached_models() -> list[CachedModel]:
    """Every GGUF model file in the Hub cache (model repositories) and in minfer's URL cache."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    out = []
    try:
        repos = scan_cache_dir().repos
    except CacheNotFound:
        repos = frozenset()
    for r in sorted(repos, key=lambda r: r.repo_id):
        if r.repo_type != "model":
            continue
        seen = set()
        for rev in sorted(r.revisions, key=lambda v: v.last_modified, reverse=True):
            for f in sorted(rev.files, key=lambda f: f.file_name):
                rel = f.file_path.relative_to(rev.snapshot_path).as_posix()
                if is_model_file(rel) and rel not in seen:
                    seen.add(rel)
                    out.append(CachedModel(f"{r.repo_id}/{rel}", f.file_path, f.size_on_disk))
    urls = cache_dir() / "urls"
    for d in sorted(urls.iterdir()) if urls.is_dir() else ():
        src = d / "url"
        for g in d.glob("*.gguf"):
            name = src.read_text(encoding="utf-8").strip() if src.is_file() else str(g)
            out.append(CachedModel(name, g, g.stat().st_size))
    return out


def remove(ref: str) -> list[str]:
    """Remove cached models: a URL's file, a repository's files matching :QUANT (or FILE after
    the repository: OWNER/REPO/FILE as `minfer list` prints), or a whole repository. The names
    removed; MinferError when nothing matched."""
    if is_url(ref):
        d = url_path(ref).parent
        if not d.is_dir():
            raise MinferError(f"{ref} is not in the cache")
        shutil.rmtree(d)
        return [ref]
    parts = ref.split("/", 2)
    file = parts[2] if len(parts) == 3 else None
    hf = HFRef.parse("/".join(parts[:2]))
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        repos = [r for r in scan_cache_dir().repos if r.repo_type == "model" and r.repo_id == hf.repo]
    except CacheNotFound:
        repos = []
    if not repos:
        raise MinferError(f"{hf.repo} is not in the cache (minfer list shows what is)")
    repo = repos[0]
    if file is None and hf.tag is None:
        shutil.rmtree(repo.repo_path, ignore_errors=True)
        return [hf.repo]
    removed, blobs_kept, blobs_gone = [], set(), set()
    for rev in repo.revisions:
        for f in rev.files:
            rel = f.file_path.relative_to(rev.snapshot_path).as_posix()
            match = rel.lower() == file.lower() if file else (
                is_model_file(rel) and re.search(re.escape(hf.tag) + r"[.-]", rel, re.I))
            if match:
                f.file_path.unlink(missing_ok=True)
                blobs_gone.add(f.blob_path)
                removed.append(f"{hf.repo}/{rel}")
            else:
                blobs_kept.add(f.blob_path)
    if not removed:
        raise MinferError(f"no cached file of {hf.repo} matches {file or hf.tag!r} (minfer list shows what is)")
    for b in blobs_gone - blobs_kept:
        b.unlink(missing_ok=True)
    return sorted(set(removed))


def human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def say(msg: str) -> None:
    print(f"minfer: {msg}", file=sys.stderr, flush=True)
