"""`minfer devices`: the devices minfer can run on here: cpu, cuda (torch's GPUs) and the wgpu
adapters the vulkan / gpu backend sees (Vulkan, Metal; Mesa's lavapipe counts: it is software)."""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    p = sub.add_parser("devices", help="list the devices and GPU adapters minfer can run on")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=devices)


def devices(a: argparse.Namespace) -> int:
    import torch

    from ..kernels.wgpu.device import adapters

    rows = [{"device": "cpu", "name": "torch on the host (the reference)"}]
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        rows.append({"device": "cuda", "name": torch.cuda.get_device_name(i), "index": i})
    for ad in adapters():
        info = dict(ad.info)
        rows.append({"device": "vulkan" if info.get("backend_type") == "Vulkan" else "gpu",
                     "name": info.get("device", "?"), "type": info.get("adapter_type"),
                     "api": info.get("backend_type"), "driver": info.get("description"),
                     "subgroups": "subgroup" in ad.features})
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        extra = ", ".join(f"{k} {r[k]}" for k in ("type", "api", "driver", "subgroups") if r.get(k) not in (None, ""))
        print(f"{r['device']:7} {r['name']}" + (f"  ({extra})" if extra else ""))
    if not any(r["device"] == "vulkan" for r in rows):
        print("(no Vulkan adapter: pip install 'minfer[vulkan]' and a Vulkan driver; without a GPU, "
              "apt-get install mesa-vulkan-drivers)")
    return 0
