"""In-process A/B: the measured what-ifs run in the user's process after the measured steps, on its own
model and last batch (autocast, channels_last, foreach, threads, float64, GPU probes), and the MFU's
matmul peak. Variants are timed in rotating rounds by ``pitstop.measure``."""
