// A device function in the probe's second build, so that it links nvcc objects as our extensions do.
__global__ void refusal_probe_kernel(int* x) { *x = 1; }
