"""Where a run lives and who owns it: the run directory's files (atomic writes, checkpoints),
its lock, the processes of a distributed job, the Hydra callbacks of a sweep, and the kernel
settings its environment chooses (:mod:`posbench.runs.kernels`).

Every stage writes into a run directory, so this package sits below all of them and imports
none of them."""
