"""Which MoveIt Servo instance is there: the DDS endpoints that serve its
`switch_command_type` service.

Servo forgets its command type when it restarts, so the node must tell a new Servo from the one
it selected the type on. A clean stop is easy to see: the service disappears from the graph,
then reappears. A Servo killed outright (SIGKILL, a crash, then `respawn: true`) is not: its
endpoints stay in DDS discovery until their lease runs out (20 s with Fast DDS's defaults), the
respawned Servo's appear beside them under the same node name, and the service never looks
absent. Node names do not help either (the graph resolves a new participant's node names up to
seconds after its endpoints, measured here), but every endpoint has its own GID, new for every
process: the request reader of each server of `<servo>/switch_command_type` identifies one
Servo instance. A GID the node has not selected the type on is a Servo that has not been told.

`server_gids` reads them from the graph (rclpy's `get_subscriptions_info_by_topic` on the
service's request topic, 'rq<service>Request': the name rmw_fastrtps and rmw_cyclonedds give
it). An rmw that does not list service endpoints this way yields an empty set, and only the
service's disappearance shows a restart.
"""
from __future__ import annotations


def request_topic(service_name: str) -> str:
    """'/servo_node/switch_command_type' -> 'rq/servo_node/switch_command_typeRequest'."""
    return f'rq{service_name}Request'


def server_gids(node, service_name: str) -> frozenset:
    """The GIDs (bytes) of the servers of `service_name` in `node`'s graph, dead ones whose
    lease has not run out included."""
    try:
        infos = node.get_subscriptions_info_by_topic(request_topic(service_name),
                                                     no_mangle=True)
    except Exception:           # an rmw without this query, a node being destroyed
        return frozenset()
    return frozenset(bytes(info.endpoint_gid) for info in infos)


def unselected(servers: frozenset, selected_on: frozenset | None) -> frozenset:
    """The servers the command type was not selected on (all of them when it never was)."""
    return servers if selected_on is None else servers - selected_on


__all__ = ['request_topic', 'server_gids', 'unselected']
