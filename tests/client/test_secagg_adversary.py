"""A malicious server against client.secagg: a server half that deviates from the protocol drives
real clients stage by stage and tries each attack of docs/security.md#threat-model: a split view
with a colluding client, a second sum of the same input over one client fewer (by a restart, a
replay in another session, or the same input in another round), zero noise or a larger clip sent
to clients whose own settings ask for noise, and a sum smaller than the clients accept. Each is
refused, or gathers fewer shares than rebuild a secret; and each succeeds with the defence that
stops it turned off, so the defence is what stops it."""

from __future__ import annotations

from collections.abc import Mapping
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
from pollen.core.protection import SecAggSettings
from secagg import encoding, graph, keys, masks
from tests.fakes import secagg_digests, secagg_shares_items, settings_of

ENC = encoding.Encoding(4.0, 16, 24)
SIZE = 40


class MaliciousServer:
    """Drives the clients `envs` through one session of a secure sum over the complete graph
    (every client the neighbour of every other), with whatever unmask requests the attack
    needs."""

    def __init__(self, envs: Mapping[int, ClientEnv], session: str, phase: str = "train") -> None:
        self.envs = dict(envs)
        self.cohort = sorted(envs)
        self.session = session
        self.phase = phase
        self.round = int(session.split("-", 1)[0])
        self.public: dict[int, dict[str, bytes]] = {}
        self.sealed: dict[int, dict[int, bytes]] = {}
        self.y: dict[int, np.ndarray] = {}

    def instruction(
        self, stage: str, config: Mapping[str, Any], items: Mapping[str, bytes] | None = None
    ) -> RecordDict:
        content = protocol.instruction(self.round, stage)
        content[contract.CONFIG] = ConfigRecord({contract.SESSION: self.session, **config})
        if items is not None:
            content[contract.BYTES] = protocol.to_record(contract.to_bytes_record(items))
        return content

    def keys_and_shares(self) -> None:
        for c, env in self.envs.items():
            cfg = {contract.COHORT: self.cohort}
            self.public[c] = _items(secagg.advertise(self.instruction(contract.KEYS, cfg), env))
        k = len(self.cohort) - 1  # the complete graph (the clients' own k for these sizes)
        assert graph.degree(len(self.cohort)) == k
        self.seed = graph.seed_of(self.session, secagg_digests(self.session, self.public))
        for c, env in self.envs.items():
            members, items = secagg_shares_items(self.session, self.public, k, c)
            request = self.instruction(contract.SHARES, {contract.MEMBERS: members}, items)
            reply = secagg.share(request, env)
            self.sealed[c] = {int(n.split("/")[1]): ct for n, ct in _items(reply).items()}

    def masked(
        self, values: Mapping[int, np.ndarray], summing: Mapping[str, Any] | None = None
    ) -> None:
        """The masked stage with each client's `values` as its reply; `summing`: fields of the
        Summing record the server sends (noise, clips)."""
        spec = Summing(self.session, (("arrays", "w", (SIZE,)),), clip=ENC.clip, bits=ENC.bits,
                       modulus_bits=ENC.modulus_bits, **(summing or {}))  # fmt: skip
        for c, env in self.envs.items():
            content = protocol.instruction(self.round, self.phase,
                                           arrays={"w": np.zeros(SIZE, np.float32)})  # fmt: skip
            content[contract.CONFIG] = spec.to_config()
            inbox = {f"from/{j}": self.sealed[j][c] for j in self.cohort if j != c}
            content[contract.BYTES] = protocol.to_record(contract.to_bytes_record(inbox))
            reply = protocol.reply(content, c, {protocol.NUM_EXAMPLES: 10},
                                   arrays={"w": values[c]})  # fmt: skip
            out = secagg.masked(reply, content, env)
            self.y[c] = protocol.arrays_of(out, contract.MASKED)[contract.Y]

    def sign(self, c: int, members: list[int]) -> bytes:
        """Client c's signature on `members` as the sum's list (the consistency round); a
        colluder's is made with its key, whatever it signed before."""
        cfg = {contract.SUM: members}
        return _items(secagg.consistency(self.instruction(contract.CONSISTENCY, cfg),
                                         self.envs[c]))["sig"]  # fmt: skip

    def forged(self, c: int, members: list[int]) -> bytes:
        with secagg.Sessions(self.envs[c]).open(self.session) as st:
            key = keys.signing_key(bytes.fromhex(st["v"]))
        return keys.sign_members(key, self.session, self.seed, members)

    def unmask(
        self,
        c: int,
        survivors: list[int],
        dropped: list[int],
        sigs: Mapping[int, bytes] | None = None,
    ) -> dict[str, bytes]:
        """Client c's answer to the unmasking of a sum of `survivors`; with the consistency
        round, `sigs` (default: every survivor's own signature on that list, asked now)."""
        cfg = {contract.SURVIVORS: survivors, contract.DROPPED: dropped, contract.SUM: survivors}
        items = None
        if "v" in self.public[c]:
            if sigs is None:
                sigs = {j: self.sign(j, survivors) for j in survivors}
            items = {f"sig/{j}": sig for j, sig in sigs.items() if j != c}
        content = self.instruction(contract.UNMASK, cfg, items)
        return _items(secagg.unmask(content, self.envs[c]))

    def held_by(self, c: int) -> dict[str, dict[int, bytes]]:
        """What a colluding client hands the server: every share it holds, of both secrets."""
        with secagg.Sessions(self.envs[c]).open(self.session) as st:
            received = {int(j): v for j, v in st["received"].items()}
        return {
            "b": {j: bytes.fromhex(v["b"]) for j, v in received.items()},
            "s": {j: bytes.fromhex(v["s"]) for j, v in received.items()},
        }

    def input_of(self, victim: int, seed: bytes, s_key: bytes) -> np.ndarray:
        """The victim's input from its masked vector, its self-mask seed and its masking key."""
        y = self.y[victim].astype(np.uint64)
        y = encoding.subtract(y, masks.mask(masks.self_key(seed, self.session), SIZE + 1,
                                            ENC.modulus_bits), ENC)  # fmt: skip
        key = keys.private_key(s_key)
        for j in self.cohort:
            if j == victim:
                continue
            agreed = keys.agreed_key(key, self.public[j]["s"])
            pair = masks.mask(masks.pairwise_key(agreed, self.session), SIZE + 1, ENC.modulus_bits)
            if masks.pairwise_sign(victim, j) > 0:
                y = encoding.subtract(y, pair, ENC)
            else:
                y = encoding.add(y, pair, ENC)
        values, weight = encoding.decode(y, ENC)
        assert weight == pytest.approx(1.0)
        return values


def _items(reply: RecordDict) -> dict[str, bytes]:
    return contract.byte_strings(protocol.arrays_of(reply, contract.BYTES))


def _envs(run_config: dict[str, Any], tmp_path: Path, n: int, **extra: Any) -> dict[int, ClientEnv]:
    settings = settings_of({**run_config, "num-clients": n, "secagg.enabled": True, **extra})
    cache = Path(str(settings["cache-dir"]))
    return {c: ClientEnv(c, settings, tmp_path / "state", "run", cache, None) for c in range(n)}


def _values(n: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(7)
    return {c: rng.uniform(-1, 1, SIZE).astype(np.float32) for c in range(n)}


SESSION = "1-train-00000000000000aa"


# ---- a split view with one colluding client ----------------------------------------------
def _split_view(envs: dict[int, ClientEnv]) -> tuple[MaliciousServer, dict[str, list[bytes]]]:
    """5 clients, victim 0, client 4 colluding: clients 1 and 2 are told the victim dropped
    (they reveal its masking key's share), client 3 and the victim itself that it survived
    (they reveal its seed's share), and the colluder hands over both of its shares. Each honest
    client reveals one share of the victim's, as the per-client rule allows."""
    server = MaliciousServer(envs, SESSION)
    server.keys_and_shares()
    values = _values(5)
    server.masked(values)
    got: dict[str, list[bytes]] = {"b": [], "s": []}
    # the consistency round: each group signs its own list, the colluder both
    gone, alive = [1, 2, 3, 4], [0, 1, 2, 3, 4]
    on_gone = {1: server.sign(1, gone), 2: server.sign(2, gone), 4: server.forged(4, gone)}
    on_alive = {0: server.sign(0, alive), 3: server.sign(3, alive), 4: server.forged(4, alive)}
    asks = [(1, gone, [0], on_gone, "s"), (2, gone, [0], on_gone, "s")]
    asks += [(3, alive, [], on_alive, "b"), (0, alive, [], on_alive, "b")]
    for c, told, dropped, sigs, side in asks:
        try:
            got[side].append(server.unmask(c, told, dropped, sigs)[f"{side}/0"])
        except secagg.SecAggRefused:  # too few signatures on its list: nothing revealed
            continue
    colluder = server.held_by(4)
    got["b"].append(colluder["b"][0])
    got["s"].append(colluder["s"][0])
    return server, got


def test_a_split_view_with_one_colluder_recovers_the_victim_s_input_at_the_majority_threshold(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """The attack with the defence off (secagg.collusion=0: t = 3 of 5, a majority): three
    shares of each secret reach the server, which unmasks the victim's input alone."""
    envs = _envs(run_config, tmp_path, 5)
    assert SecAggSettings.of(envs[0].settings).threshold_for(4) == 3
    server, got = _split_view(envs)
    seed, s_key = keys.combine(got["b"][:3]), keys.combine(got["s"][:3])
    assert keys.seed_hash(SESSION, seed) == server.public[0]["b-hash"]
    recovered = server.input_of(0, seed, s_key)
    np.testing.assert_allclose(recovered, _values(5)[0], atol=2 * ENC.step)


def test_a_split_view_with_one_colluder_gathers_too_few_shares_with_collusion_1(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """secagg.collusion=1 raises t until 2t > k + 1 + c (4 of 5): with the consistency round
    each group holds three signatures on its list, one too few, and no honest client reveals
    anything; without it, the same split view gathers three shares of each secret, one too few
    for either."""
    envs = _envs(run_config, tmp_path, 5, **{"secagg.collusion": 1})
    assert SecAggSettings.of(envs[0].settings).threshold_for(4) == 4
    server, got = _split_view(envs)
    assert len(got["b"]) == len(got["s"]) == 1  # the colluder's own
    unsigned = _envs(run_config, tmp_path / "unsigned", 5,
                     **{"secagg.collusion": 1, "secagg.consistency": False})  # fmt: skip
    server, got = _split_view(unsigned)
    assert len(got["b"]) == len(got["s"]) == 3
    seed = keys.combine(got["b"])
    assert keys.seed_hash(SESSION, seed) != server.public[0]["b-hash"]
    try:
        key = keys.private_key(keys.combine(got["s"]))
    except keys.ShareError:  # not a scalar of the curve at all
        return
    assert keys.public_bytes(key) != server.public[0]["s"]


def test_the_clients_refuse_a_collusion_their_neighbourhood_cannot_meet(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """The run's graph (k = 10 for 20 clients) holds 2t > k + 1 + c for c = 9, but a sum of
    11 (k = 8) cannot: the client refuses the keys stage of such a cohort (a run set up so is
    refused before start-up: tests/pollen/test_secagg.py). The server cannot hand it a
    smaller neighbourhood instead: each client draws its own from the members' keys
    (tests/client/test_secagg.py)."""
    envs = _envs(run_config, tmp_path, 20, **{"secagg.collusion": 9})
    assert SecAggSettings.of(envs[0].settings).threshold_for(graph.degree(20)) == 11
    cfg = {contract.COHORT: list(range(11))}
    server = MaliciousServer(envs, SESSION)
    with pytest.raises(secagg.SecAggRefused, match="needs a threshold of 10 shares"):
        secagg.advertise(server.instruction(contract.KEYS, cfg), envs[0])


# ---- sums smaller than the clients accept --------------------------------------------------
def test_a_sum_smaller_than_the_client_s_minimum_is_refused(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    envs = _envs(run_config, tmp_path, 4, **{"secagg.min-clients": 4})
    server = MaliciousServer(envs, SESSION)
    server.keys_and_shares()
    server.masked(_values(4))
    with pytest.raises(secagg.SecAggRefused, match="a sum of 3 clients"):
        server.unmask(0, [0, 1, 2], [3])  # 3 declared dropped: a sum of 3
    assert server.unmask(0, [0, 1, 2, 3], [])  # the whole cohort: answered
    five = _envs(run_config, tmp_path / "small", 5, **{"secagg.collusion": 1})
    small = {c: five[c] for c in (0, 1)}  # a cohort of 2 where the clients accept 3
    with pytest.raises(secagg.SecAggRefused, match=r"a sum of 2 clients asked; .* 3 at least"):
        MaliciousServer(small, SESSION).keys_and_shares()


# ---- differencing: the same input summed again over fewer clients --------------------------
def _session(rnd: int, phase: str, tag: int) -> str:
    return f"{rnd}-{phase}-{tag:016x}"


def _sum_again(
    envs: dict[int, ClientEnv], session: str, members: list[int], phase: str = "train"
) -> None:
    """A second session with the same values; all of `envs` take part up to the masked stage,
    then client 0 is asked to unmask a sum over `members`."""
    server = MaliciousServer(envs, session, phase)
    server.keys_and_shares()
    server.masked(_values(len(envs)))
    server.unmask(0, members, [c for c in server.cohort if c not in members])


@pytest.mark.parametrize("again", ["restart", "another round"])
def test_a_second_sum_of_the_same_input_over_one_client_fewer_is_refused(
    run_config: dict[str, Any], tmp_path: Path, again: str
) -> None:
    """Client 0 took part in a sum over 0-5; the server asks it to unmask a sum of the same
    input over 0-4 (a restart in the same round and phase, or the same vector in another
    round): their difference would be client 5's input. Refused; a sum over the same clients,
    or missing two (m = 2), is answered; one that adds a client is refused."""
    envs = _envs(run_config, tmp_path, 6)
    _sum_again(envs, _session(1, "train", 1), list(range(6)))
    rnd = 1 if again == "restart" else 2
    with pytest.raises(secagg.SecAggRefused, match="must leave out 2 of them at least"):
        _sum_again(envs, _session(rnd, "train", 2), [0, 1, 2, 3, 4])
    _sum_again(envs, _session(rnd, "train", 3), list(range(6)))  # the same set: the same sum
    _sum_again(envs, _session(rnd, "train", 4), [0, 1, 2, 3])
    with pytest.raises(secagg.SecAggRefused, match="and add none"):
        _sum_again(envs, _session(rnd, "train", 5), [0, 1, 2, 3, 4])


def test_without_the_client_s_check_two_sums_give_one_client_s_input(
    run_config: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack the check stops: with it off, the sums over 0-5 and 0-4 of the same inputs,
    unmasked with the shares the clients reveal, differ by client 5's input."""
    monkeypatch.setattr(secagg.Sessions, "no_differencing", lambda *a: None)
    envs = _envs(run_config, tmp_path, 6)
    totals = []
    for tag, members in ((1, list(range(6))), (2, [0, 1, 2, 3, 4])):
        server = MaliciousServer(envs, _session(1, "train", tag))
        server.keys_and_shares()
        server.masked(_values(6))
        dropped = [c for c in server.cohort if c not in members]
        shares: dict[str, list[bytes]] = {}
        for c in members:
            for name, share in server.unmask(c, members, dropped).items():
                shares.setdefault(name, []).append(share)
        total = np.zeros(SIZE + 1, np.uint64)
        for c in members:
            total = encoding.add(total, server.y[c], ENC)
        t = SecAggSettings.of(envs[0].settings).threshold_for(5)
        for c in members:
            seed = keys.combine(shares[f"b/{c}"][:t])
            own = masks.mask(masks.self_key(seed, server.session), SIZE + 1, ENC.modulus_bits)
            total = encoding.subtract(total, own, ENC)
        for gone in dropped:
            key = keys.private_key(keys.combine(shares[f"s/{gone}"][:t]))
            for i in members:
                agreed = keys.agreed_key(key, server.public[i]["s"])
                pair_key = masks.pairwise_key(agreed, server.session)
                pair = masks.mask(pair_key, SIZE + 1, ENC.modulus_bits)
                sign = masks.pairwise_sign(i, gone)
                total = (encoding.subtract if sign > 0 else encoding.add)(total, pair, ENC)
        totals.append(encoding.decode(total, ENC)[0])
    np.testing.assert_allclose(totals[0] - totals[1], _values(6)[5], atol=12 * ENC.step)


# ---- the clients' own privacy settings --------------------------------------------------------
DP = {"client-dp.noise-multiplier": 0.5, "client-dp.clip": 1.0, "client-dp.noise-at": "client"}


def test_zero_noise_or_a_larger_clip_from_the_server_is_refused(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """Clients whose settings ask for distributed noise (z = 0.5 at clip 1) refuse a masked
    stage with no noise, less than their share over the cohort, or a larger l2 clip; the
    honest request is answered."""
    envs = _envs(run_config, tmp_path, 4, **DP)
    server = MaliciousServer(envs, SESSION)
    server.keys_and_shares()
    scale = 2.0 ** (ENC.bits - 1) / ENC.clip
    share = (0.5 * 1.0 * scale) ** 2 / 4
    with pytest.raises(secagg.SecAggRefused, match="noise of variance 0"):
        server.masked(_values(4), {"l2_clip": 1.0, "noise_variance": 0.0})
    with pytest.raises(secagg.SecAggRefused, match="clip its update to l2 norm 10"):
        server.masked(_values(4), {"l2_clip": 10.0, "noise_variance": 100 * share})
    with pytest.raises(secagg.SecAggRefused, match="privacy settings need"):
        server.masked(_values(4), {"l2_clip": 1.0, "noise_variance": share / 2})
    server.masked(_values(4), {"l2_clip": 1.0, "noise_variance": share})
    assert len(server.y) == 4


def test_without_the_floor_a_client_sends_its_update_unnoised(
    run_config: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack the floor stops: with the client's own floor off, a server's variance 0 is
    followed and the masked input carries no noise (unmasked, it is the update itself)."""
    monkeypatch.setattr(secagg, "own_floor", lambda env, phase: (0.0, 0.0))
    envs = _envs(run_config, tmp_path, 4, **DP)
    server = MaliciousServer(envs, SESSION)
    server.keys_and_shares()
    values = {c: v * 0.1 for c, v in _values(4).items()}  # within the clip: not scaled
    server.masked(values, {"l2_clip": 1.0, "noise_variance": 0.0})
    seed_shares = [server.held_by(c)["b"][0] for c in (1, 2, 3)]
    s_shares = [server.held_by(c)["s"][0] for c in (1, 2, 3)]
    recovered = server.input_of(0, keys.combine(seed_shares), keys.combine(s_shares))
    np.testing.assert_allclose(recovered, values[0], atol=2 * ENC.step)


# ---- the consistency round -------------------------------------------------------------------
def test_a_client_unmasks_only_a_list_it_signed_with_t_signatures_of_its_neighbourhood(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """6 clients (t = 4): client 0 signed the sum's list; told another list, or given fewer
    than t - 1 valid signatures of others on its list (one forged by the server), it refuses."""
    envs = _envs(run_config, tmp_path, 6)
    server = MaliciousServer(envs, SESSION)
    server.keys_and_shares()
    server.masked(_values(6))
    members = list(range(6))
    sigs = {j: server.sign(j, members) for j in members}
    with pytest.raises(secagg.SecAggRefused, match="did not sign"):
        server.unmask(0, [0, 1, 2, 3, 4], [5], {j: sigs[j] for j in range(1, 5)})
    with pytest.raises(secagg.SecAggRefused, match="a second, different list"):
        server.sign(0, [0, 1, 2, 3, 4])
    fake = {1: sigs[1], 2: sigs[2], 3: server.forged(5, [0, 1, 2])}  # 3's is not 3's
    with pytest.raises(secagg.SecAggRefused, match="3 of this client's neighbourhood signed"):
        server.unmask(0, members, [], fake)
    assert server.unmask(0, members, [], {j: sigs[j] for j in (1, 2, 3)})  # t = 4 with its own


def test_without_the_consistency_round_a_client_unmasks_a_list_it_never_saw(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """The defence off (secagg.consistency=false): the server's list is taken as it comes."""
    envs = _envs(run_config, tmp_path, 6, **{"secagg.consistency": False})
    server = MaliciousServer(envs, SESSION)
    server.keys_and_shares()
    server.masked(_values(6))
    assert server.unmask(0, [0, 1, 2, 3], [4, 5])


# ---- key substitution: the server stands in for a victim's neighbours -----------------------
def _node_keys(tmp_path: Path, n: int) -> Path:
    """n SuperNode key pairs (ECDSA P-384, OpenSSH, as scripts/generate-certs.sh --nodes makes
    them): node-I.key, and node-I.pub in the returned directory (the allow-list)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pubs = tmp_path / "supernodes"
    pubs.mkdir()
    for i in range(n):
        key = ec.generate_private_key(ec.SECP384R1())
        (pubs / f"node-{i}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ))  # fmt: skip
        (pubs / f"node-{i}.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        ))  # fmt: skip
    return pubs


def _substitute(envs: dict[int, ClientEnv], victim: int) -> np.ndarray:
    """The server hands the victim keys of its own making for every neighbour, with digests
    of them (so the graph the victim draws is the one they give), and the real clients' node
    signatures; it decrypts the shares the victim seals for them, sends the victim shares of
    its own, and unmasks the victim's masked input alone. Returns the input it recovers."""
    server = MaliciousServer(envs, SESSION)
    for c, env in envs.items():
        request = server.instruction(contract.KEYS, {contract.COHORT: server.cohort})
        server.public[c] = _items(secagg.advertise(request, env))
    own = {j: (keys.new_private_key(), keys.new_private_key()) for j in server.cohort}
    view = {victim: server.public[victim]}  # the others with the real nodes' signatures
    for j in server.cohort:
        if j != victim:
            view[j] = {**server.public[j], "c": keys.public_bytes(own[j][0]),
                       "s": keys.public_bytes(own[j][1])}  # fmt: skip
    members, items = secagg_shares_items(SESSION, view, len(envs) - 1, victim)
    request = server.instruction(contract.SHARES, {contract.MEMBERS: members}, items)
    sealed = _items(secagg.share(request, envs[victim]))
    victim_c = view[victim]["c"]
    got = {
        j: keys.unseal(keys.agreed_key(own[j][0], victim_c), victim, j, sealed[f"to/{j}"])
        for j in members if j != victim
    }  # fmt: skip
    t = SecAggSettings.of(envs[victim].settings).threshold_for(len(members) - 1)
    seed = keys.combine([g.b for g in got.values()][:t])
    s_key = keys.combine([g.s for g in got.values()][:t])
    # the masked stage: shares of the server's making from the fake neighbours
    spec = Summing(SESSION, (("arrays", "w", (SIZE,)),), clip=ENC.clip, bits=ENC.bits,
                   modulus_bits=ENC.modulus_bits)  # fmt: skip
    content = protocol.instruction(server.round, "train", arrays={"w": np.zeros(SIZE, np.float32)})
    content[contract.CONFIG] = spec.to_config()
    filler = keys.Shares(bytes(4 + 16), bytes(4 + 32))
    inbox = {f"from/{j}": keys.seal(keys.agreed_key(own[j][0], victim_c), j, victim, filler)
             for j in members if j != victim}  # fmt: skip
    content[contract.BYTES] = protocol.to_record(contract.to_bytes_record(inbox))
    reply = protocol.reply(content, victim, {protocol.NUM_EXAMPLES: 10},
                           arrays={"w": _values(len(envs))[victim]})  # fmt: skip
    out = secagg.masked(reply, content, envs[victim])
    server.y[victim] = protocol.arrays_of(out, contract.MASKED)[contract.Y]
    server.public = view
    return server.input_of(victim, seed, s_key)


def _node_envs(
    envs: dict[int, ClientEnv], pubs: Path, check: bool
) -> dict[int, ClientEnv]:
    """Each client with its node's key; with `check`, the registered nodes' keys too."""
    from dataclasses import replace

    return {
        c: replace(env, secagg_key=str(pubs / f"node-{c}.key"),
                   secagg_peers=str(pubs) if check else None)
        for c, env in envs.items()
    }  # fmt: skip


def test_keys_the_server_substitutes_for_a_victim_s_neighbours_are_refused_when_nodes_sign(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """With each node's key signing what its client advertises and the registered nodes' keys
    on every client (pollen client --auth-key, --peer-keys), keys of the server's making carry
    no valid signature: the victim refuses before it seals any share. Signatures from a key
    that is not registered, or one key signing for two clients, are refused too."""
    pubs = _node_keys(tmp_path, 6)
    envs = _node_envs(_envs(run_config, tmp_path, 5), pubs, check=True)
    with pytest.raises(secagg.SecAggRefused, match="node signature does not verify"):
        _substitute(envs, 0)
    honest = MaliciousServer(envs, "1-train-00000000000000bb")
    honest.keys_and_shares()  # honest keys, each signed by its node: taken
    assert len(honest.sealed) == 5
    stranger = {**envs, 4: _node_envs({4: envs[4]}, pubs, True)[4]}
    stranger[4] = replace_key(stranger[4], pubs / "node-5.key", tmp_path / "elsewhere")
    with pytest.raises(secagg.SecAggRefused, match="not registered"):
        MaliciousServer(stranger, "1-train-00000000000000cc").keys_and_shares()
    twice = {**envs, 4: replace_key(envs[4], pubs / "node-3.key", None)}
    with pytest.raises(secagg.SecAggRefused, match="signs for another client too"):
        MaliciousServer(twice, "1-train-00000000000000dd").keys_and_shares()


def replace_key(env: ClientEnv, key: Path, move: Path | None) -> ClientEnv:
    """`env` signing with `key`; `move`: the key's .pub taken off the allow-list (moved there)."""
    from dataclasses import replace

    if move is not None:
        move.mkdir()
        pub = key.with_suffix(".pub")
        pub.rename(move / pub.name)  # the directory changes: the clients read it again
    return replace(env, secagg_key=str(key))


def test_without_the_node_check_substituted_keys_give_the_server_the_victim_s_input(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """The attack the node signatures stop: with the clients not checking them (no
    --peer-keys), the server, with no colluding client at all, decrypts the victim's shares of
    both secrets and unmasks its input alone."""
    pubs = _node_keys(tmp_path, 5)
    envs = _node_envs(_envs(run_config, tmp_path, 5), pubs, check=False)
    np.testing.assert_allclose(_substitute(envs, 0), _values(5)[0], atol=2 * ENC.step)
