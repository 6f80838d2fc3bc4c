"""client.secagg: the rules that keep a client's input hidden, driven stage by stage as a server
(honest, then not) would drive three clients: the same request answered alike, a different one
refused, never both shares of one neighbour, the threshold taken from the run's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from client import secagg
from client.env import ClientEnv
from pollen.core import protocol
from pollen.core.contracts import secagg as contract
from pollen.core.contracts.secagg import Summing
from secagg import encoding, keys, masks
from tests.fakes import secagg_shares_items, settings_of

SESSION = "1-train-0123456789abcdef"
CLIENTS = (0, 1, 2)


def _envs(run_config: dict[str, Any], tmp_path: Path, **extra: Any) -> dict[int, ClientEnv]:
    """Three clients; the consistency round is off here (its own tests are in
    test_secagg_adversary.py): these drive the other rules alone."""
    settings = settings_of({**run_config, "secagg.enabled": True, "secagg.consistency": False,
                            **extra})  # fmt: skip
    cache = Path(str(settings["cache-dir"]))
    return {c: ClientEnv(c, settings, tmp_path / "state", "run", cache, None) for c in CLIENTS}


def _instruction(
    stage: str, config: dict[str, Any], items: dict[str, bytes] | None = None
) -> RecordDict:
    content = protocol.instruction(1, stage)
    if stage == contract.UNMASK and contract.SUM not in config:
        config = {**config, contract.SUM: config[contract.SURVIVORS]}  # neighbourhoods: all
    content[contract.CONFIG] = ConfigRecord({contract.SESSION: SESSION, **config})
    if items is not None:
        content[contract.BYTES] = protocol.to_record(contract.to_bytes_record(items))
    return content


def _items(reply: RecordDict) -> dict[str, bytes]:
    return contract.byte_strings(protocol.arrays_of(reply, contract.BYTES))


def _keys(envs: dict[int, ClientEnv]) -> dict[int, dict[str, bytes]]:
    return {
        c: _items(secagg.advertise(
            _instruction(contract.KEYS, {contract.COHORT: list(CLIENTS)}),
            env,
        ))
        for c, env in envs.items()
    }  # fmt: skip


def _public(pk: dict[int, dict[str, bytes]], c: int = 0) -> dict[str, bytes]:
    """Client c's shares-stage byte strings (the complete graph of three)."""
    return secagg_shares_items(SESSION, pk, 2, c)[1]


def _share_request(items: dict[str, bytes]) -> RecordDict:
    return _instruction(contract.SHARES, {contract.MEMBERS: list(CLIENTS)}, items)


def _shares(envs: dict[int, ClientEnv], pk: dict[int, dict[str, bytes]]) -> dict[int, dict]:
    out = {}
    for c, env in envs.items():
        reply = secagg.share(_share_request(_public(pk, c)), env)
        out[c] = {int(n.split("/")[1]): ct for n, ct in _items(reply).items()}
    return out


def _masked_instruction(c: int, sealed: dict[int, dict], size: int) -> RecordDict:
    summing = Summing(SESSION, (("arrays", "w", (size,)),), bits=16, modulus_bits=24, clip=4.0)
    content = protocol.instruction(1, "train", arrays={"w": np.zeros(size, np.float32)})
    content[contract.CONFIG] = summing.to_config()
    inbox = {f"from/{j}": sealed[j][c] for j in CLIENTS if j != c}
    content[contract.BYTES] = protocol.to_record(contract.to_bytes_record(inbox))
    return content


def _reply(c: int, value: np.ndarray, instruction: RecordDict) -> RecordDict:
    return protocol.reply(instruction, c, {protocol.NUM_EXAMPLES: 10}, arrays={"w": value})


def _through_the_masked_stage(
    run_config: dict[str, Any], tmp_path: Path
) -> tuple[dict[int, ClientEnv], dict[int, np.ndarray], dict[int, np.ndarray]]:
    envs = _envs(run_config, tmp_path)
    pk = _keys(envs)
    sealed = _shares(envs, pk)
    rng = np.random.default_rng(0)
    values = {c: rng.uniform(-1, 1, 50).astype(np.float32) for c in CLIENTS}
    ys = {}
    for c, env in envs.items():
        instruction = _masked_instruction(c, sealed, 50)
        reply = secagg.masked(_reply(c, values[c], instruction), instruction, env)
        assert [n for n in reply if n.endswith("arrays")] == []  # the update never leaves
        ys[c] = protocol.arrays_of(reply, contract.MASKED)[contract.Y]
    return envs, values, ys


def test_three_clients_masks_cancel_and_their_own_shares_rebuild_nothing_else(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    envs, values, ys = _through_the_masked_stage(run_config, tmp_path)
    enc = encoding.Encoding(4.0, 16, 24)
    total = np.zeros(51, np.uint64)
    for y in ys.values():
        total = encoding.add(total, y, enc)
    # the server removes the self masks with the seeds rebuilt from t = 2 of 3 shares
    held: dict[int, list[bytes]] = {c: [] for c in CLIENTS}
    everyone = {contract.SURVIVORS: list(CLIENTS), contract.DROPPED: []}
    for env in envs.values():
        reply = secagg.unmask(_instruction(contract.UNMASK, everyone), env)
        for name, share in _items(reply).items():
            held[int(name[2:])].append(share)
    for c in CLIENTS:
        seed = keys.combine(held[c][:2])
        total = encoding.subtract(total, masks.mask(masks.self_key(seed, SESSION), 51, 24), enc)
    sums, weight = encoding.decode(total, enc)
    assert weight == 3.0
    np.testing.assert_allclose(sums, sum(values.values()), atol=3 * enc.step)


def test_a_client_never_reveals_both_shares_of_a_neighbour(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    envs, _, _ = _through_the_masked_stage(run_config, tmp_path)
    env = envs[0]
    both = {contract.SURVIVORS: [0, 1, 2], contract.DROPPED: [2]}
    with pytest.raises(secagg.SecAggRefused, match="both shares of clients \\[2\\]"):
        secagg.unmask(_instruction(contract.UNMASK, both), env)
    first = {contract.SURVIVORS: [0, 1, 2], contract.DROPPED: []}
    once = secagg.unmask(_instruction(contract.UNMASK, first), env)
    again = secagg.unmask(_instruction(contract.UNMASK, first), env)
    assert _items(once) == _items(again)  # the same request, the same answer
    # then told that client 2 dropped: its masking key's share would unmask its input
    later = {contract.SURVIVORS: [0, 1], contract.DROPPED: [2]}
    with pytest.raises(secagg.SecAggRefused, match="named alive and dropped"):
        secagg.unmask(_instruction(contract.UNMASK, later), env)


def test_the_unmasking_keeps_to_the_run_s_threshold_and_the_client_s_own_input(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    envs, _, _ = _through_the_masked_stage(run_config, tmp_path)
    env = envs[0]  # k = 2, t = 2 (more than half of 3): one survivor is too few
    with pytest.raises(secagg.SecAggRefused, match="1 clients in the sum, 2 needed"):
        secagg.unmask(_instruction(contract.UNMASK, {contract.SURVIVORS: [0],
                                                     contract.DROPPED: [1, 2]}), env)  # fmt: skip
    with pytest.raises(secagg.SecAggRefused, match="leaves out this client"):
        secagg.unmask(_instruction(contract.UNMASK, {contract.SURVIVORS: [1, 2],
                                                     contract.DROPPED: []}), env)  # fmt: skip
    with pytest.raises(secagg.SecAggRefused, match="does not hold"):
        secagg.unmask(_instruction(contract.UNMASK, {contract.SURVIVORS: [0, 1, 7],
                                                     contract.DROPPED: []}), env)  # fmt: skip


def test_keys_and_shares_are_answered_alike_and_refused_when_asked_differently(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    envs = _envs(run_config, tmp_path)
    pk = _keys(envs)
    assert _keys(envs) == pk  # a resent keys request: the same keys
    with pytest.raises(secagg.SecAggRefused, match="another cohort"):
        cfg = {contract.COHORT: [0, 1, 2, 3]}
        secagg.advertise(_instruction(contract.KEYS, cfg), envs[0])
    public = _public(pk)
    first = _items(secagg.share(_share_request(public), envs[0]))
    again = _items(secagg.share(_share_request(public), envs[0]))
    assert first == again  # the stored ciphertexts, byte for byte
    fewer = {k: v for k, v in public.items() if not k.endswith("/2")}
    with pytest.raises(secagg.SecAggRefused, match="different share request"):
        secagg.share(_share_request(fewer), envs[0])


def test_shares_are_refused_for_forged_keys_or_a_neighbourhood_the_graph_does_not_draw(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """Keys substituted by the server (its own for a neighbour's, or swapped between clients)
    do not match the digests the graph is drawn from; digests changed with them draw another
    graph and leave this client's own digest wrong; a neighbourhood missing a client the graph
    names is refused."""
    envs = _envs(run_config, tmp_path)
    pk = _keys(envs)
    public = _public(pk)
    swapped = {**public, "s/0": pk[1]["s"], "s/1": pk[0]["s"]}
    with pytest.raises(secagg.SecAggRefused, match="not its digest's"):
        secagg.share(_share_request(swapped), envs[0])
    own = keys.public_bytes(keys.new_private_key())
    substituted = {**pk, 1: {**pk[1], "c": own}}  # the server's key, with a digest of it
    items = secagg_shares_items(SESSION, substituted, 2, 2)[1]
    items["digests"] = _public(pk, 2)["digests"]  # the digests the clients' keys give
    with pytest.raises(secagg.SecAggRefused, match="not its digest's"):
        secagg.share(_share_request(items), envs[2])
    fewer = {k: v for k, v in _public(pk, 1).items() if not k.endswith("/2")}
    with pytest.raises(secagg.SecAggRefused, match="not those of this client's neighbourhood"):
        secagg.share(_share_request(fewer), envs[1])
    mine = {**pk, 0: {**pk[0], "c": own}}
    with pytest.raises(secagg.SecAggRefused, match="not of its keys"):
        secagg.share(_share_request(secagg_shares_items(SESSION, mine, 2, 0)[1]), envs[0])


def test_a_second_different_masked_request_is_refused(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    envs = _envs(run_config, tmp_path)
    sealed = _shares(envs, _keys(envs))
    instruction = _masked_instruction(0, sealed, 50)
    value = np.ones(50, np.float32)
    once = secagg.masked(_reply(0, value, instruction), instruction, envs[0])
    again = secagg.masked(_reply(0, value, instruction), instruction, envs[0])
    same = protocol.arrays_of(once, contract.MASKED)[contract.Y]
    assert np.array_equal(same, protocol.arrays_of(again, contract.MASKED)[contract.Y])
    other = _masked_instruction(0, sealed, 49)  # another layout under the same session
    with pytest.raises(secagg.SecAggRefused, match="different masked-input request"):
        secagg.masked(_reply(0, value[:49], other), other, envs[0])


def test_sessions_must_be_named_as_the_server_names_them(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    env = _envs(run_config, tmp_path)[0]
    bad = protocol.instruction(1, contract.KEYS)
    bad[contract.CONFIG] = ConfigRecord({contract.SESSION: "../../x", contract.COHORT: [0, 1]})
    with pytest.raises(secagg.SecAggRefused, match="not a session name"):
        secagg.advertise(bad, env)
    with pytest.raises(secagg.SecAggRefused, match="no masked input"):
        secagg.unmask(
            _instruction(contract.UNMASK, {contract.SURVIVORS: [0, 1], contract.DROPPED: []}), env
        )
    assert not (env.state.dir.parent / "x.json").exists()
