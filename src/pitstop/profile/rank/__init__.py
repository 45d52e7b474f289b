"""Inside one rank of a torchrun / accelerate launch (or one child of the script): its worker, its
collectives and DDP all-reduce timing, its state files and the job-wide view shared through the store."""
