"""A secure-aggregation client's node keys (docs/security.md#threat-model): with `secagg-key`
(`pollen client --auth-key`) the node signs the digest of the keys its client advertises, and
with `secagg-peers` (`--peer-keys`, the registered nodes' public keys) the client takes a
session's members only when each one's digest is signed by a registered node key of its own,
so that the server can neither stand in for a neighbour with keys of its own making nor add
members."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from client.env import ClientEnv
from secagg import keys


class SecAggRefused(ValueError):
    """An instruction a client of a secure sum must not follow; its reason goes back to the
    server as the client's error."""


_NODE_KEYS: dict[str, Any] = {}


def node_key(path: str) -> Any:
    """The node's authentication key, read once a process."""
    if path not in _NODE_KEYS:
        try:
            _NODE_KEYS[path] = keys.read_node_key(Path(path))
        except keys.NodeKeyError as exc:
            raise SecAggRefused(f"secagg: {exc}") from None
    return _NODE_KEYS[path]


def _peer_keys(directory: str) -> dict[bytes, Any]:
    """The registered nodes' keys, read again whenever the directory changed (a resident
    worker outlives registrations)."""
    try:
        stamp = f"{directory}@{Path(directory).stat().st_mtime_ns}"
    except OSError as exc:
        raise SecAggRefused(f"secagg: peer keys {directory} cannot be read ({exc})") from None
    if stamp not in _NODE_KEYS:
        try:
            _NODE_KEYS[stamp] = keys.read_peer_keys(Path(directory))
        except keys.NodeKeyError as exc:
            raise SecAggRefused(f"secagg: {exc}") from None
    return dict(_NODE_KEYS[stamp])


def authenticated(
    env: ClientEnv, members: list[int], digests: Mapping[int, bytes], public: Mapping[str, bytes]
) -> None:
    """With `secagg-peers` (the registered nodes' keys): SecAggRefused unless every member's
    digest is signed by a registered node key, no key signs for two members, and this
    client's own is its node's: the server cannot add clients of its own making, stand in for
    a neighbour with keys of its own, or make the sum look larger than it is."""
    if not env.secagg_peers:
        return
    peers = _peer_keys(env.secagg_peers)
    seen: set[bytes] = set()
    for j in members:
        key_id, sig = public.get(f"p/{j}"), public.get(f"a/{j}")
        if key_id is None or sig is None:
            raise SecAggRefused(f"secagg: client {j}'s keys come without its node's signature")
        if key_id in seen or key_id not in peers:
            raise SecAggRefused(
                f"secagg: client {j}'s keys are signed by a node key that is not registered "
                "or signs for another client too"
            )
        if not keys.node_signed(peers[key_id], sig, digests[j]):
            raise SecAggRefused(f"secagg: client {j}'s node signature does not verify")
        seen.add(key_id)
    if env.secagg_key and public[f"p/{env.cid}"] != keys.node_key_id(
        node_key(env.secagg_key).public_key()
    ):
        raise SecAggRefused("secagg: the node key named as this client's is not its node's")
