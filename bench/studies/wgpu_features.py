"""What the wgpu adapter offers for tensor-core matmuls (issue 27 item 3): the adapter, whether the
experimental `cooperative-matrix` native feature is there, and the other features. Run on the GPU machine:
`python bench/studies/wgpu_features.py` (the first adapter whose name contains MINFER_WGPU_ADAPTER, else the
high-performance one)."""
import json

import wgpu

from minfer.config import EngineConfig

want = EngineConfig.from_env().wgpu_adapter
adapters = wgpu.gpu.enumerate_adapters_sync()
pick = next((a for a in adapters if want and want.lower() in a.info["device"].lower()), None) or \
    wgpu.gpu.request_adapter_sync(power_preference="high-performance")
feats = sorted(pick.features)
print(json.dumps({"wgpu": wgpu.__version__, "adapter": pick.info["device"], "backend": pick.info.get("backend_type"),
                  "cooperative_matrix": "cooperative-matrix" in feats, "features": feats}, indent=1))
