"""System level: `pitstop launch` (CPU binding, threads, allocator, instances, torchrun wrapping),
`pitstop sysctl` (kernel-parameter advice, applied only with consent) and `pitstop monitor` (live view)."""
