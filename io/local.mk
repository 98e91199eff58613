# io fragment
