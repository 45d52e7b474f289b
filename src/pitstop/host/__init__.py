"""Facts about this machine: CPU (model, flags, usable cores), precision support, memory, NUMA topology,
kernel interfaces (/proc, /sys), NVIDIA GPUs through NVML, and how busy the machine is.

Each fact has one implementation here; doctor reports them, launch binds by them, train and profile
size their choices from them.
"""
