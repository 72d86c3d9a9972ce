# Sourced by the bench/vulkan_*.sh device runs: NVIDIA's Vulkan driver reachable on the GPU machine, which has
# no Vulkan loader and no wgpu. Unpacks the carried .deb files (.gl: libvulkan1 and libglvnd's libraries) at /,
# points the loader at NVIDIA's ICD where the image keeps it, unzips the carried wheels (.whl: wgpu, cffi,
# pycparser, rendercanvas) into /tmp/pylib (no pip, no network), lists the adapters into $OUT/devices.txt and
# picks NVIDIA's. bench/vulkan_h200.sh's header says how to fill .gl and .whl. Sets PYTHONPATH, OUT, M, since().
export PYTHONPATH=.:/tmp/pylib:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; M=${M:-/tmp/models}; mkdir -p "$OUT" "$M"
T0=$(date +%s); since() { echo "[$(( $(date +%s) - T0 )) s]"; }
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
if ! ls /usr/share/vulkan/icd.d/nvidia_icd*.json /etc/vulkan/icd.d/nvidia_icd*.json >/dev/null 2>&1 \
   && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
fi
for w in .whl/*.whl; do python3 -m zipfile -e "$w" /tmp/pylib; done
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.mem --format=csv,noheader
python3 -m minfer.cli devices 2>&1 | grep -v XDG_RUNTIME_DIR | tee "$OUT/devices.txt"
grep -q '^vulkan .*NVIDIA' "$OUT/devices.txt" || echo "!! no NVIDIA Vulkan adapter: the runs below use whatever adapter is listed"
export MINFER_WGPU_ADAPTER=${MINFER_WGPU_ADAPTER:-NVIDIA}
