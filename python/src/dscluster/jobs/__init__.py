"""Job scripts shipped to the cluster (run there with the cluster venv, not imported here)."""

# The smoke job: its entry script first, then the modules it imports from the job directory
# (each is staged there beside it; the nodes have no dscluster to import them from).
SMOKE_JOB_FILES = (
    "smoke_job.py",
    "smoke_bench.py",
    "smoke_checks.py",
    "smoke_device.py",
    "smoke_report.py",
    "smoke_train.py",
)

# The resumable DeepSpeed job (checkpoints, resumes, reloads at another world size): one file.
RESUME_JOB_FILES = ("resume_job.py",)
