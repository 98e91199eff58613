# backends/nccl fragment
