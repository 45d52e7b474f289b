"""planted_ddp.py as a script written for srun (one task per rank) runs it: it maps Slurm's variables itself."""

import os
import runpy
from pathlib import Path

os.environ.setdefault("RANK", os.environ["SLURM_PROCID"])
os.environ.setdefault("WORLD_SIZE", os.environ["SLURM_NTASKS"])
runpy.run_path(str(Path(__file__).with_name("planted_ddp.py")), run_name="__main__")
