# tests/slurm: the job scripts of jobscripts/ end to end: the workstation
# launchers, and the Slurm scripts on a one-node Slurm cluster that
# test_slurm.sh brings up itself (it needs root; it skips otherwise).
dist_check_SCRIPTS += tests/slurm/test_launchers.sh tests/slurm/test_slurm.sh
