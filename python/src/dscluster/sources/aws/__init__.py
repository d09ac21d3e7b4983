"""AWS as an inventory source, laid out like skypilot's sky/provision/<cloud>/.

    session.py    the boto3 session and clients, region, profile, endpoint, error lines
    config.py     dscluster's tags; up's option checks; placement and security groups, subnet,
                  AMI, key pair, IMDSv2, the encrypted root volume, a baked AMI's cloud-config
    discover.py   running instances -> nodes (types, AMI family, console host keys) -> a
                  Cluster: `dscluster inventory aws` (describe_cluster, in sources.describe)
    instance.py   `dscluster aws up/down`: run, wait for, name and terminate the instances

Imports go one way: session <- config <- discover <- instance.
"""
