"""`pitstop doctor`: audit this machine and this Python/torch install for PyTorch training speed.

One module per area (gpu, cuda, cpu, memory, storage, system, python_env); each probe returns Findings.
``run_doctor`` (runner.py) runs them all, each guarded, into one Report.
"""

from pitstop.doctor.runner import DoctorOptions, run_doctor

__all__ = ["DoctorOptions", "run_doctor"]
