"""A multi-node Ray cluster on one machine, every node on 127.0.0.1, in a process of its own.

Run as a script: it starts a head node and ``--workers`` worker nodes (``--cpus`` each) with
``ray.cluster_utils.Cluster``, prints one JSON line ``{"address": ..., "head": node id,
"workers": [node ids]}``, then reads commands from stdin: ``remove NODE_ID`` kills that node's
processes (as if the machine went away) and answers ``removed NODE_ID``; end of input shuts the
cluster down. Tests start it with ``start_new_session=True`` and end it with
:func:`helpers.procs.kill_tree`, so no Ray process outlives them.

With ``--join ADDRESS`` it instead starts one node (``--cpus``) that joins the cluster at
``ADDRESS``, as ``Cluster.add_node`` does (``ray start --address`` refuses a multi-node cluster
while Ray is kept on loopback), prints ``{"node": node id}`` and stops the node at end of input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

LOOPBACK = "127.0.0.1"
# nodes that stop answering are declared dead after about 3 s (Ray's default is about 15 s)
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpus", type=float, default=1)
    parser.add_argument("--join", default=None, metavar="ADDRESS")
    args = parser.parse_args()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before ray is imported: loopback
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    if args.join is not None:
        join(args.join, args.cpus)
        return
    import ray._private.utils
    from ray.cluster_utils import Cluster

    # Cluster() records its address in /tmp/ray/ray_current_cluster, as `ray start` does; while
    # that file names a cluster, a plain ray.init() by anyone on this machine joins it (or fails
    # once it is gone). This test cluster is only reached by address: record nothing.
    ray._private.utils.write_ray_address = lambda *args, **kwargs: None

    node = {"num_cpus": args.cpus, "node_ip_address": LOOPBACK, "include_dashboard": False}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node, "_system_config": FAST_HEALTH_CHECKS},
    )
    workers = {}
    for _ in range(args.workers):
        added = cluster.add_node(**node)
        workers[added.node_id] = added
    print(
        json.dumps(
            {
                "address": cluster.address,
                "head": cluster.head_node.node_id,
                "workers": list(workers),
            }
        ),
        flush=True,
    )
    try:
        for line in sys.stdin:
            command, _, node_id = line.strip().partition(" ")
            if command == "remove" and node_id in workers:
                cluster.remove_node(workers.pop(node_id), allow_graceful=False)
                print(f"removed {node_id}", flush=True)
    finally:
        cluster.shutdown()


def join(address: str, cpus: float) -> None:
    """One node joining the cluster at ``address`` until end of input."""
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    params = RayParams(
        num_cpus=cpus,
        num_gpus=0,
        node_ip_address=LOOPBACK,
        include_dashboard=False,
        gcs_address=address,
        include_log_monitor=False,
        node_manager_port=0,
        object_store_memory=150 * 1024 * 1024,
        min_worker_port=0,
        max_worker_port=0,
    )
    params.dashboard_agent_listen_port = None
    node = Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
    print(json.dumps({"node": node.node_id}), flush=True)
    try:
        for _ in sys.stdin:
            pass
    finally:
        node.kill_all_processes(check_alive=False, allow_graceful=True)


if __name__ == "__main__":
    main()
