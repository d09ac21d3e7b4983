"""Inventory sources behind one interface (as skypilot's sky/provision routes one interface
to per-cloud modules).

Every source decides one cluster and returns it as a `cluster.Cluster` (name, head first,
nodes with their slots and vars, group vars, extra groups, known_hosts); `cluster.write` is
the one writer of `inventories/<name>/hosts.yml` + `hostfile`. Naming rules: names.py.

    local.up(name, nodes, ...)           node containers on this machine   (local.describe)
    aws.write_inventory(session, ...)    running EC2 instances of a cluster (aws.describe)
    slurm.write_inventory(name, ...)     a Slurm allocation or node list   (static.describe)
    static.write_inventory(hosts, ...)   a plain host list                 (static.describe)

ec2.py holds the EC2 access aws.py and aws_cluster.py (`dscluster aws up/down`) share.
Nothing is imported here, so that low-level modules (hostfile) can import names.py.
"""
