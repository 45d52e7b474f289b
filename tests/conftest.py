import os

# Tests must not fight over the 2 cores, nor pick up a user's thread settings.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
