"""Loaded kernels: KernelCache (per device, over compiled bytes), GuardedCache, the module loader."""
