"""What a run is on its target: its start in tmux (or as a Slurm job: ``slurm``), its supervisor (restarts, stalls,
grace, the causes of its end), the standby supervisor that saves a start its Python start-up, the hand-over of its
secrets, the environment and working folder it inherits, its resumption after a reboot, and a failed guard's way back
(``rollback``: it stops and starts runs, so it lives beside them).
"""

# the modules the rest of the agent may import; the others are this room's own (tests/unit/test_layers.py)
__all__ = ["launch_env", "reboot_unit", "rollback", "runs", "series", "slurm", "standby", "start_check", "tmux",
           "workdir"]
