EXTRA_DIST += \
	jobscripts/local/demo.sh \
	jobscripts/local/train-common.sh \
	jobscripts/local/train-env.sh \
	jobscripts/local/train-mpiexec.sh \
	jobscripts/slurm/convert.sbatch \
	jobscripts/slurm/train-env.sbatch \
	jobscripts/slurm/train.sbatch
