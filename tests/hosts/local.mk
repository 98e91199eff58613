# tests/hosts: jobs across hosts made with network namespaces on this
# machine (root; skipped with the reason elsewhere).
dist_check_DATA += tests/hosts/hosts_lib.sh
dist_check_SCRIPTS += tests/hosts/test_hosts.sh
