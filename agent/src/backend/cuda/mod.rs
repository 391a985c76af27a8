//! Real backend: cudarc (CUDA driver, NVRTC, cuBLAS) + NVML.
