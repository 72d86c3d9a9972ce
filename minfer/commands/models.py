"""`minfer pull`, `minfer list`, `minfer rm`: models by name, in the caches (Ollama's verbs).

    minfer pull OWNER/REPO[:QUANT]   download a Hugging Face model file (llama.cpp's -hf rule picks it)
    minfer pull https://.../x.gguf   download a URL
    minfer list                      the GGUF model files cached: name, size, path
    minfer rm OWNER/REPO[:QUANT]     remove the matching files (OWNER/REPO alone: the whole repository)

Hub downloads live in huggingface_hub's cache (HF_HOME / HF_HUB_CACHE), URLs in minfer's
(MINFER_CACHE); hub.py does the work.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import common


def add_parser(sub) -> None:
    p = sub.add_parser("pull", help="download a model: OWNER/REPO[:QUANT] from Hugging Face, or an http(s) URL",
                       description="Download a GGUF model into the cache (resumes an interrupted download); "
                                   "`run -hf` / `-m URL` then start from the cached file, also offline.")
    p.add_argument("name", metavar="OWNER/REPO[:QUANT]|URL")
    p.add_argument("-hff", "--hf-file", dest="hf_file", default=None, metavar="FILE",
                   help="the repository's file to take (instead of :QUANT)")
    p.add_argument("-hft", "--hf-token", dest="hf_token", default=None, metavar="TOKEN",
                   help="Hugging Face token (default: HF_TOKEN or the saved login)")
    p.set_defaults(func=pull)

    p = sub.add_parser("list", help="the GGUF models in the caches (Hugging Face's and minfer's)",
                       description="Every cached GGUF model file: the name to give run -hf / rm, its size, its path.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=list_models)

    p = sub.add_parser("rm", help="remove cached models: OWNER/REPO[:QUANT], OWNER/REPO/FILE or a URL",
                       description="Remove cached model files. OWNER/REPO:QUANT removes the files of that quant, "
                                   "OWNER/REPO/FILE one file (as `minfer list` names it), OWNER/REPO the whole "
                                   "repository, a URL its download.")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(func=rm)


def pull(a: argparse.Namespace) -> int:
    from ..hub import HFRef, fetch, fetch_url, human, is_url

    if is_url(a.name):
        path = fetch_url(a.name, token=a.hf_token, progress=common.on_terminal())
    else:
        path = fetch(HFRef.parse(a.name), file=a.hf_file, token=a.hf_token, progress=common.on_terminal())
    print(f"{path}  ({human(path.stat().st_size)})")
    return 0


def list_models(a: argparse.Namespace) -> int:
    from ..hub import cached_models, human

    models = cached_models()
    if a.json:
        print(json.dumps([{"name": m.name, "size": m.size, "path": str(m.path)} for m in models], indent=1))
        return 0
    if not models:
        print("no models cached (minfer pull OWNER/REPO[:QUANT] fetches one)", file=sys.stderr)
        return 0
    width = max(len(m.name) for m in models)
    print(f"{'NAME':{width}}  {'SIZE':>9}  PATH")
    for m in models:
        print(f"{m.name:{width}}  {human(m.size):>9}  {m.path}")
    return 0


def rm(a: argparse.Namespace) -> int:
    from ..hub import remove

    for name in a.names:
        for gone in remove(name):
            print(f"removed {gone}")
    return 0
