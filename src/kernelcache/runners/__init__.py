"""Where a compile runs: in the caller's process or in compiler workers, under the node's budget
(choice.py: which; pool.py, worker.py, worker_main.py: the workers; slots.py: the budget;
job.py: the one compile a worker, or a Dask worker, runs; compilers.py: the compilers themselves)."""
