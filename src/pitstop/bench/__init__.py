"""`pitstop bench`: the tuning guides' claims, measured on this machine.

    from pitstop.bench.runner import BenchOptions, run_bench
    from pitstop.bench.results import to_report, print_table

    result = run_bench(BenchOptions(workload="vision", size="small", budget_s=300))

Modules: workloads (reference models + data made on the fly), configs (the ablation and the claims),
session (one config made runnable with pitstop.train's recipes), measure (matmul peak, FLOPs, step
memory), measure_configs (warm-up + interleaved timing), worker/subproc (compile and DDP in their own
processes), schedules (OneCycle vs StepLR), rows (measured numbers -> ratios, verdicts), runner (the whole
run inside a budget), results (Report, table, HTML, PNG, Markdown), cli. Importing this package does not
import torch.
"""
