"""brigade-rocm: the AMD GPU platform for Brigade. The entry point is ``brigade_rocm.plugin``."""
