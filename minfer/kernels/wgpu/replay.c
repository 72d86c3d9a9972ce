/* Encode a captured decode step's dispatches into a WebGPU compute pass (kernels/wgpu/device.py's
 * `Device.replay`). The step is ~340-400 dispatches of up to three wgpu-native calls each; looped in
 * Python through cffi, SmolLM2's 396 took 0.96 ms to encode on a 2-core CI machine, from here 0.60
 * (the rest is wgpu-native's own work per call). wgpu-native's entry points come in as function pointers from the
 * caller's own loaded copy of the library (wgpu-py's cffi handle): nothing is linked here. */
#include <stddef.h>
#include <stdint.h>

typedef void (*set_pipeline_fn)(void *pass, void *pipeline);
typedef void (*set_bind_group_fn)(void *pass, uint32_t index, void *group, size_t n_offsets, const uint32_t *offsets);
typedef void (*dispatch_fn)(void *pass, uint32_t x, uint32_t y, uint32_t z);

/* n dispatches: pipelines[i] (set only when it changes), bind group groups[i] at group index 0
 * with its one dynamic offset offsets[i], then grid[3 i .. 3 i + 2] workgroups. */
void minfer_replay(void *pass, int64_t n, void *const *pipelines, void *const *groups, const uint32_t *offsets,
                   const uint32_t *grid, set_pipeline_fn set_pipeline, set_bind_group_fn set_bind_group,
                   dispatch_fn dispatch) {
    void *last = NULL;
    for (int64_t i = 0; i < n; i++) {
        if (pipelines[i] != last) {
            set_pipeline(pass, pipelines[i]);
            last = pipelines[i];
        }
        set_bind_group(pass, 0, groups[i], 1, offsets + i);
        dispatch(pass, grid[3 * i], grid[3 * i + 1], grid[3 * i + 2]);
    }
}
