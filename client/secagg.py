"""A client's side of a secure sum (SecAgg+; the stages: pollen.core.contracts.secagg): its keys,
its shares, its masked input and the shares it reveals to unmask the sum, with the rules that
keep its input hidden from the server (docs/security.md#secure-aggregation).

What the client keeps of a session lives in its state directory (`secagg/<session>.json`,
readable by its user only, never sent): its private keys and self-mask seed, the shares it sealed
for its neighbours and the ones it received, and which neighbours' secrets it revealed. Every
stage is answered alike when asked twice (a resent instruction), and refused when asked
differently: its keys are drawn once per session, its sealed shares kept, its masked input
computed again from the same data, seeds and shares; a session seen once with one neighbourhood
is never taken up with another. In the unmasking it never reveals, for one neighbour, both the
share of its masking key (the neighbour dropped) and that of its self-mask seed (the neighbour
is in the sum), within one request or across requests, and it answers only with at least t
clients in its neighbourhood's part of the sum.

It also holds the server to the client's own settings, whatever the server's instructions say:
a threshold raised for `secagg.collusion`; a sum of at least m = `secagg.fewest()` clients; the
noise and the clip of its own client-level DP (or FedSC's DP-CalR noise) in every masked input;
and no two unmasked sums of one input (the same round and phase, or the same vector) over member
sets that differ by fewer than m clients: a later sum of the same input is over a subset of
every earlier one, missing at least m of its clients, or over the same set. Otherwise the
difference of the two sums would be the contribution of the few clients between them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from client.env import ClientEnv
from client.secagg_nodes import SecAggRefused, authenticated, node_key
from pollen.core import protocol
from pollen.core.contracts import client_dp
from pollen.core.contracts import secagg as contract
from pollen.core.contracts.fedsc import CORRELATION_PHASE, FedSCSettings
from pollen.core.contracts.secagg import Summing
from pollen.core.files import atomic_write_bytes
from pollen.core.protection import SecAggSettings
from secagg import encoding, graph, keys, masks, noise

_SESSION = re.compile(r"^(\d{1,9})-[A-Za-z0-9._]{1,64}-[0-9a-f]{16}$")
KEEP_ROUNDS = 2
"""A client keeps the sessions of this many rounds before the newest one it took part in."""


# ---- what a client keeps of a session ---------------------------------------------------
def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class Sessions:
    """A client's secure-aggregation sessions on disk, one JSON file each, read and changed
    under a lock (two processes may answer one client: a resent instruction)."""

    def __init__(self, env: ClientEnv) -> None:
        self.dir = env.state.dir / "secagg"

    @contextmanager
    def open(self, session: str, durable: bool = False) -> Iterator[dict[str, Any]]:
        """The session's record, written back (atomically; `durable`: on disk) when the block
        changed it."""
        if not _SESSION.match(session):
            raise SecAggRefused(f"secagg: {session!r} is not a session name")
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.dir / f"{session}.json"
        with open(self.dir / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = json.loads(path.read_text()) if path.exists() else {}
                before = json.dumps(state, sort_keys=True)
                yield state
                if json.dumps(state, sort_keys=True) != before:
                    atomic_write_bytes(path, json.dumps(state).encode(), sync=durable)
                    self._forget_old(int(session.split("-", 1)[0]))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def no_differencing(
        self, session: str, st: Mapping[str, Any], members: list[int], fewest: int
    ) -> None:
        """SecAggRefused when another session of the same input (its round and phase, or its
        vector's digest) was unmasked over a member set that `members` is not a subset of, or
        misses fewer than `fewest` clients of (and is not equal to): the two sums' difference
        would be the input of fewer clients than a sum may hold. Called under the lock."""
        now = set(members)
        for path in sorted(self.dir.glob("*.json")):
            if path.stem == session:
                continue
            try:
                other = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if "members" not in other:
                continue
            same = other.get("input") == st.get("input") or (
                other.get("input-digest") is not None
                and other.get("input-digest") == st.get("input-digest")
            )
            if not same:
                continue
            earlier = set(other["members"])
            if now == earlier:
                continue
            if not now <= earlier or len(earlier - now) < fewest:
                raise SecAggRefused(
                    f"secagg: this input was summed in session {path.stem} over other clients; "
                    f"a sum of it again must leave out {fewest} of them at least, and add none "
                    "(else the difference of the two sums gives away the input of the few "
                    "between them)"
                )

    def _forget_old(self, server_round: int) -> None:
        for path in self.dir.glob("*.json"):
            head = path.name.split("-", 1)[0]
            if head.isdigit() and int(head) < server_round - KEEP_ROUNDS:
                path.unlink(missing_ok=True)


def _session(content: RecordDict) -> tuple[ConfigRecord, str]:
    cfg = contract.config_of(content)
    return cfg, str(cfg.get(contract.SESSION, ""))


def _threshold(env: ClientEnv, k: int) -> int:
    """t, from the client's settings (never from the message): a server cannot lower it."""
    try:
        return SecAggSettings.of(env.settings).threshold_for(k)
    except ValueError as exc:
        raise SecAggRefused(f"secagg: {exc}") from None


def _parameters(env: ClientEnv, clients: int) -> tuple[int, int]:
    """k and t of a graph of `clients`, from the client's settings (secagg.degree, .threshold,
    .collusion, .dropout), never from the message."""
    try:
        return SecAggSettings.of(env.settings).graph_for(clients)
    except ValueError as exc:
        raise SecAggRefused(f"secagg: {exc}") from None


_MECHANISMS: dict[str, client_dp.Mechanism | None] = {}


def _own_mechanism(env: ClientEnv) -> client_dp.Mechanism | None:
    """The client's own client-level DP (calibrated once per settings: a target epsilon takes
    Opacus' accountant)."""
    key = json.dumps(sorted((k, str(v)) for k, v in env.settings.items()))
    if key not in _MECHANISMS:
        _MECHANISMS.clear()
        _MECHANISMS[key] = client_dp.mechanism(env.settings)
    return _MECHANISMS[key]


def own_floor(env: ClientEnv, phase: str) -> tuple[float, float]:
    """What the client's own settings require of a masked input of `phase`: the standard
    deviation of the noise the whole sum must carry, in the values' units (client-level DP's
    z x l2 clip when its noise is distributed; FedSC's DP-CalR noise for its correlation
    matrices when shared out in the sum), and the largest l2 clip (0: none required)."""
    mech = _own_mechanism(env)
    clip = mech.clip if mech is not None and mech.distributed else 0.0
    if phase == CORRELATION_PHASE:
        fedsc = FedSCSettings.of(env.settings)
        return (fedsc.noise_std if fedsc.noise_at == "sum" else 0.0), clip
    if mech is None or not mech.distributed:
        return 0.0, 0.0
    return mech.noise_multiplier, clip


def _reply(content: RecordDict, env: ClientEnv, items: Mapping[str, bytes]) -> RecordDict:
    return protocol.reply(
        content,
        env.cid,
        {protocol.NUM_EXAMPLES: 0},
        **{contract.BYTES: contract.to_bytes_record(items)},
    )


def _incoming(content: RecordDict) -> dict[str, bytes]:
    if contract.BYTES not in content:
        return {}
    return contract.byte_strings(protocol.arrays_of(content, contract.BYTES, copy=False))


# ---- stage 1: keys ----------------------------------------------------------------------
def advertise(content: RecordDict, env: ClientEnv) -> RecordDict:
    """Two key pairs and a self-mask seed for the session (drawn once), answered as the public
    keys and the seed's hash."""
    cfg, session = _session(content)
    cohort = contract.ids(cfg.get(contract.COHORT, []), "cohort")
    if not _SESSION.match(session):
        raise SecAggRefused(f"secagg: {session!r} is not a session name")
    if len(set(cohort)) != len(cohort) or env.cid not in cohort:
        raise SecAggRefused("secagg: the cohort must name every client of the sum once, this "
                            "client among them")  # fmt: skip
    settings = SecAggSettings.of(env.settings)
    fewest = settings.fewest()
    if len(cohort) < fewest:
        raise SecAggRefused(
            f"secagg: a sum of {len(cohort)} clients asked; this client sums with {fewest} at "
            "least (secagg.min-clients, secagg.collusion)"
        )
    _parameters(env, len(cohort))  # a cohort no graph can serve: refused now
    with Sessions(env).open(session) as st:
        if "c" in st and st["cohort"] != sorted(cohort):
            raise SecAggRefused(f"secagg: session {session} was set up with another cohort")
        if "c" not in st:
            st["cohort"] = sorted(cohort)
            st["c"] = keys.private_bytes(keys.new_private_key()).hex()
            st["s"] = keys.private_bytes(keys.new_private_key()).hex()
            st["b"] = os.urandom(keys.SEED_BYTES).hex()
            st["v"] = keys.signing_private_bytes(keys.new_signing_key()).hex()
    items = _advertised(st, session, settings.consistency)
    if env.secagg_key:
        key = node_key(env.secagg_key)
        items["a"] = keys.node_sign(key, keys.bundle_digest(session, env.cid, items))
        items["p"] = keys.node_key_id(key.public_key())
    return _reply(content, env, items)


def _advertised(st: Mapping[str, Any], session: str, signed: bool) -> dict[str, bytes]:
    """What the client advertises of a session's keys (and what its digest is of)."""
    c = keys.private_key(bytes.fromhex(st["c"]))
    s = keys.private_key(bytes.fromhex(st["s"]))
    items = {"c": keys.public_bytes(c), "s": keys.public_bytes(s)}
    items["b-hash"] = keys.seed_hash(session, bytes.fromhex(st["b"]))
    if signed:
        items["v"] = keys.verify_key_bytes(keys.signing_key(bytes.fromhex(st["v"])))
    return items


# ---- stage 2: shares --------------------------------------------------------------------
_SIDES = {"c": "c", "s": "s", "h": "b-hash", "v": "v"}
"""A forwarded key's prefix -> the name it was advertised under."""


def share(content: RecordDict, env: ClientEnv) -> RecordDict:
    """The seed and the masking key split into k + 1 shares (t rebuild either), one sealed for
    each neighbour; the same ciphertexts when asked again. The graph is drawn here from the
    digests of every member's keys (secagg.graph.seed_of), and the forwarded keys must be
    exactly this client's neighbourhood in it, each matching its digest."""
    cfg, session = _session(content)
    public = _incoming(content)
    settings = SecAggSettings.of(env.settings)
    with Sessions(env).open(session) as st:
        if "c" not in st:
            raise SecAggRefused(f"secagg: no keys were drawn for session {session}")
        members = contract.ids(cfg.get(contract.MEMBERS, []), "members")
        request = _digest(sorted(public.items()), members)
        if "sealed" in st:
            if st["shares-request"] != request:
                raise SecAggRefused(f"secagg: a second, different share request in {session}")
            sealed = {int(j): bytes.fromhex(ct) for j, ct in st["sealed"].items()}
            return _reply(content, env, {f"to/{j}": ct for j, ct in sorted(sealed.items())})
        seed, neighbourhood, t = _drawn(env, st, session, members, public)
        c = keys.private_key(bytes.fromhex(st["c"]))
        s = keys.private_key(bytes.fromhex(st["s"]))
        count = len(neighbourhood)
        b_shares = keys.split(bytes.fromhex(st["b"]), t, count)
        s_shares = keys.split(keys.private_bytes(s), t, count)
        position = {j: i for i, j in enumerate(neighbourhood)}
        others = [j for j in neighbourhood if j != env.cid]
        sealed = {}
        for j in others:
            mine = keys.Shares(b_shares[position[j]], s_shares[position[j]])
            sealed[j] = keys.seal(keys.agreed_key(c, public[f"c/{j}"]), env.cid, j, mine)
        me = position[env.cid]
        st.update(
            {
                "members-all": members,
                "graph": seed.hex(),
                "neighbours": others,
                "shares-request": request,
                "sealed": {str(j): ct.hex() for j, ct in sealed.items()},
                "own": {"b": b_shares[me].hex(), "s": s_shares[me].hex()},
                "peers": {str(j): public[f"s/{j}"].hex() for j in others},
                "peer-c": {str(j): public[f"c/{j}"].hex() for j in others},
                "peer-v": {str(j): public[f"v/{j}"].hex() for j in others if settings.consistency},
            }
        )
    return _reply(content, env, {f"to/{j}": ct for j, ct in sorted(sealed.items())})


def _drawn(
    env: ClientEnv,
    st: Mapping[str, Any],
    session: str,
    members: list[int],
    public: Mapping[str, bytes],
) -> tuple[bytes, list[int], int]:
    """The graph's seed, this client's neighbourhood (itself included, in id order) and t,
    drawn from the members' digests; SecAggRefused unless the members are of the cohort, this
    client's own digest is of what it advertised, and the forwarded keys are exactly its
    neighbourhood's, each matching its digest."""
    settings = SecAggSettings.of(env.settings)
    if len(set(members)) != len(members) or env.cid not in members:
        raise SecAggRefused("secagg: the members must name each client once, this one among them")
    _enough_members(env, {"members-all": st["cohort"]}, members)
    try:
        digests = contract.digests_of(members, public.get(contract.DIGESTS, b""))
    except ValueError as exc:
        raise SecAggRefused(str(exc)) from None
    if digests[env.cid] != keys.bundle_digest(
        session, env.cid, _advertised(st, session, settings.consistency)
    ):
        raise SecAggRefused("secagg: the digest named as this client's is not of its keys")
    authenticated(env, members, digests, public)
    seed = graph.seed_of(session, digests)
    k, t = _parameters(env, len(members))
    neighbourhood = sorted(graph.neighbours(members, k, seed)[env.cid] | {env.cid})
    sides = [p for p, name in _SIDES.items() if name != "v" or settings.consistency]
    wanted = {contract.DIGESTS} | {f"{p}/{j}" for j in neighbourhood for p in sides}
    signed = {n for n in public if n[:2] in ("a/", "p/") and n[2:].isdigit()}
    if set(public) - signed != wanted or not {int(n[2:]) for n in signed} <= set(members):
        raise SecAggRefused(
            "secagg: the forwarded keys are not those of this client's neighbourhood in the "
            "graph its members' keys draw"
        )
    for j in neighbourhood:
        theirs = {_SIDES[p]: public[f"{p}/{j}"] for p in sides}
        if keys.bundle_digest(session, j, theirs) != digests[j]:
            raise SecAggRefused(f"secagg: the keys forwarded as client {j}'s are not its digest's")
    if len(
        set(public[f"c/{j}"] for j in neighbourhood) | set(public[f"s/{j}"] for j in neighbourhood)
    ) != 2 * len(neighbourhood):
        raise SecAggRefused("secagg: two clients' forwarded keys are the same")
    return seed, neighbourhood, t


# ---- stage 3: the masked input ------------------------------------------------------------
def is_masked(content: RecordDict) -> bool:
    """Whether an instruction of the algorithm's own phase asks for a masked reply."""
    return contract.CONFIG in content


def masked(reply: RecordDict, instruction: RecordDict, env: ClientEnv) -> RecordDict:
    """The handler's `reply` with the summed records replaced by their encoding plus this
    client's self mask and its pairwise masks with the neighbours whose shares it received."""
    summing = Summing.of(contract.config_of(instruction))
    session = summing.session
    rnd = protocol.round_of(instruction)
    phase = str(instruction[protocol.ENVELOPE][protocol.MESSAGE_TYPE])  # type: ignore[index]
    if not session.startswith(f"{rnd}-{phase}-"):
        raise SecAggRefused(f"secagg: session {session} is not of round {rnd}, phase {phase}")
    inbox = _incoming(instruction)
    with Sessions(env).open(session) as st:
        if "sealed" not in st:
            raise SecAggRefused(f"secagg: no shares were made in session {session}")
        request = _digest(summing.to_config().items(), sorted(inbox.items()))
        if st.get("masked-request", request) != request:
            raise SecAggRefused(f"secagg: a second, different masked-input request in {session}")
        c = keys.private_key(bytes.fromhex(st["c"]))
        received: dict[str, dict[str, str]] = {}
        for name, ciphertext in inbox.items():
            j = int(name.removeprefix("from/"))
            if str(j) not in st["peer-c"]:
                raise SecAggRefused(f"secagg: shares forwarded from client {j}, not a neighbour")
            got = keys.unseal(
                keys.agreed_key(c, bytes.fromhex(st["peer-c"][str(j)])), j, env.cid, ciphertext
            )
            received[str(j)] = {"b": got.b.hex(), "s": got.s.hex()}
        t = _threshold(env, len(st["neighbours"]))
        if len(received) + 1 < t:
            raise SecAggRefused(f"secagg: shares of {len(received)} neighbours, {t - 1} needed")
        _hold_to_own_floor(env, phase, summing, len(st["members-all"]))
        st["masked-request"] = request
        st["received"] = received
        st["input"] = f"{rnd}/{phase}"
        seed = bytes.fromhex(st["b"])
        s = keys.private_key(bytes.fromhex(st["s"]))
        peers = {int(j): bytes.fromhex(st["peers"][j]) for j in received}
    vector, digest = _encoded(reply, instruction, summing, env)
    with Sessions(env).open(session) as st:
        st["input-digest"] = digest
    enc = encoding.Encoding(summing.clip, summing.bits, summing.modulus_bits)
    y = encoding.to_ring(vector, enc).astype(np.uint64)
    y = encoding.add(y, masks.mask(masks.self_key(seed, session), y.size, enc.modulus_bits), enc)
    for j, peer in sorted(peers.items()):
        agreed = keys.agreed_key(s, peer)
        pair = masks.mask(masks.pairwise_key(agreed, session), y.size, enc.modulus_bits)
        if masks.pairwise_sign(env.cid, j) > 0:
            y = encoding.add(y, pair, enc)
        else:
            y = encoding.subtract(y, pair, enc)
    out = RecordDict(
        {n: r for n, r in reply.items() if not isinstance(r, ArrayRecord)}  # metrics, envelope
    )
    metrics = protocol.metrics_of(out)
    for name in contract.PROTECTED_METRICS:  # functions of what the sum protects
        if name in metrics:
            del metrics[name]
    out[contract.MASKED] = protocol.to_record({contract.Y: y.astype(enc.dtype)})
    return out


def _hold_to_own_floor(env: ClientEnv, phase: str, summing: Summing, cohort: int) -> None:
    """SecAggRefused unless the masked input the server asks for carries at least the noise,
    and at most the l2 clip, of the client's own settings (`own_floor`): its share of the
    noise, over the `cohort` members of the graph (the shares stage), reaches the standard
    deviation the whole sum must carry."""
    std, clip = own_floor(env, phase)
    if clip > 0 and not 0 < summing.l2_clip <= clip * (1 + 1e-9):
        raise SecAggRefused(
            f"secagg: asked to clip its update to l2 norm {summing.l2_clip:g}; this client's "
            f"client-dp.clip is {clip:g}"
        )
    if std <= 0:
        return
    l2 = summing.l2_clip if phase != CORRELATION_PHASE else 1.0
    scale = 2.0 ** (summing.bits - 1) / summing.clip
    wanted = (std * l2 * scale) ** 2 / max(cohort, 1)
    if summing.noise_variance < wanted * (1 - 1e-9):
        raise SecAggRefused(
            f"secagg: asked to add noise of variance {summing.noise_variance:.6g} (encoded "
            f"units); this client's privacy settings need {wanted:.6g} for a sum of {cohort}"
        )


def _encoded(
    reply: RecordDict, instruction: RecordDict, summing: Summing, env: ClientEnv
) -> tuple[np.ndarray, str]:
    """This client's contribution, encoded (secagg.encoding), with its share of distributed
    DP's integer noise; and a digest of the vector it encodes (its input, before rounding:
    `unmask` compares the sums it takes part in by it)."""
    records = summing.records()
    carried = [n for n, r in reply.items() if isinstance(r, ArrayRecord)]
    if sorted(carried) != sorted(records):
        raise SecAggRefused(
            f"secagg: the reply carries records {sorted(carried)}, the sum is of {records}"
        )
    parts = {}
    for record in records:
        arrays = protocol.arrays_of(reply, record, copy=False)
        arrays = {k: v for k, v in arrays.items() if contract.summed_array(v)}
        base = summing.around.get(record)
        if base is not None:
            sent = protocol.arrays_of(instruction, base, copy=False)
            arrays = {k: np.asarray(v, np.float64) - sent[k] for k, v in arrays.items()}
        parts[record] = arrays
    try:
        vector = contract.flatten(parts, summing.layout)
    except (ValueError, KeyError) as exc:
        raise SecAggRefused(f"secagg: {exc}") from None
    if summing.l2_clip > 0:
        norm = float(np.linalg.norm(vector))
        if norm > summing.l2_clip:
            vector = vector * (summing.l2_clip / norm)
    enc = encoding.Encoding(summing.clip, summing.bits, summing.modulus_bits)
    weight = 1.0
    if summing.weighted:
        count = float(protocol.metrics_of(reply)[protocol.NUM_EXAMPLES])  # type: ignore[arg-type]
        weight = count / summing.weight_scale if summing.weight_scale > 0 else 0.0
    rnd = protocol.round_of(instruction)
    phase = str(instruction[protocol.ENVELOPE][protocol.MESSAGE_TYPE])  # type: ignore[index]
    rounding = np.random.default_rng(env.seed(rnd, f"secagg-rounding/{phase}"))
    encoded, _ = encoding.encode(vector, encoding.weight_units(weight, enc), enc, rounding)
    if summing.noise_variance > 0:
        private = np.random.default_rng(env.private_seed(rnd, f"secagg-noise/{phase}"))
        encoded[:-1] += noise.skellam(summing.noise_variance, vector.size, private)
    digest = hashlib.sha256(np.ascontiguousarray(vector, np.float64).tobytes()).hexdigest()
    return encoded, digest


# ---- the consistency round ------------------------------------------------------------------
def consistency(content: RecordDict, env: ClientEnv) -> RecordDict:
    """This client's signature on the list of the sum's clients, once per session: a second,
    different list is refused (the unmasking then needs t signatures on the same list)."""
    cfg, session = _session(content)
    members = sorted(contract.ids(cfg.get(contract.SUM, []), "clients of the sum"))
    with Sessions(env).open(session, durable=True) as st:
        if "received" not in st:
            raise SecAggRefused(f"secagg: this client sent no masked input in session {session}")
        if env.cid not in members:
            raise SecAggRefused("secagg: the sum's list leaves out this client")
        _enough_members(env, st, members)
        if st.setdefault("signed", members) != members:
            raise SecAggRefused(f"secagg: a second, different list of the sum in {session}")
        key = keys.signing_key(bytes.fromhex(st["v"]))
    graph_seed = bytes.fromhex(st["graph"])
    return _reply(content, env, {"sig": keys.sign_members(key, session, graph_seed, members)})


def _enough_members(env: ClientEnv, st: Mapping[str, Any], members: list[int]) -> int:
    """m (SecAggSettings.fewest); SecAggRefused unless `members`, the sum's clients, are m at
    least, all members of the graph the shares stage named."""
    fewest = SecAggSettings.of(env.settings).fewest()
    if len(members) < fewest or not set(members) <= set(st["members-all"]):
        raise SecAggRefused(
            f"secagg: a sum of {len(members)} clients of the cohort; this client sums with "
            f"{fewest} at least"
        )
    return fewest


def _consistent(
    st: Mapping[str, Any], session: str, members: list[int], sigs: Mapping[str, bytes], t: int
) -> None:
    """SecAggRefused unless this client signed `members` and, with its own, t of its
    neighbourhood's clients in the sum signed the same list (`sigs`: sig/<id>)."""
    if st.get("signed") != members:
        raise SecAggRefused("secagg: the unmasking names a sum this client did not sign")
    peers = {int(j): bytes.fromhex(v) for j, v in st["peer-v"].items()}
    seed = bytes.fromhex(st["graph"])
    valid = 1 + sum(
        keys.signed_members(peers[j], sigs[f"sig/{j}"], session, seed, members)
        for j in sorted(set(members) & set(peers))
        if f"sig/{j}" in sigs
    )
    if valid < t:
        raise SecAggRefused(
            f"secagg: {valid} of this client's neighbourhood signed the sum's list, {t} needed"
        )


# ---- stage 4: unmask ------------------------------------------------------------------------
def unmask(content: RecordDict, env: ClientEnv) -> RecordDict:
    """The shares of the self-mask seeds of the neighbours in the sum (this client's own
    included) and of the masking keys of those that dropped; refused when the lists overlap,
    contradict an earlier answer, name clients it holds no shares of, leave it out, or hold
    fewer than t clients of the sum."""
    cfg, session = _session(content)
    survivors = contract.ids(cfg.get(contract.SURVIVORS), "survivors")
    dropped = contract.ids(cfg.get(contract.DROPPED), "dropped")
    members = sorted(contract.ids(cfg.get(contract.SUM, []), "clients of the sum"))
    sessions = Sessions(env)
    with sessions.open(session, durable=True) as st:
        if "received" not in st:
            raise SecAggRefused(f"secagg: this client sent no masked input in session {session}")
        held = {int(j) for j in st["received"]} | {env.cid}
        both = sorted(set(survivors) & set(dropped))
        if both:
            raise SecAggRefused(f"secagg: asked for both shares of clients {both}; refused")
        if not (set(survivors) | set(dropped)) <= held:
            raise SecAggRefused("secagg: asked for shares this client does not hold")
        if env.cid not in survivors or env.cid in dropped:
            raise SecAggRefused("secagg: the unmasking leaves out this client's own input")
        t = _threshold(env, len(st["neighbours"]))
        if len(survivors) < t:
            raise SecAggRefused(f"secagg: {len(survivors)} clients in the sum, {t} needed")
        neighbourhood = {*st["neighbours"], env.cid}
        if sorted(neighbourhood & set(members)) != sorted(survivors):
            raise SecAggRefused(
                "secagg: the clients of the sum and this client's survivors do not agree"
            )
        fewest = _enough_members(env, st, members)
        sessions.no_differencing(session, st, members, fewest)
        if SecAggSettings.of(env.settings).consistency:
            _consistent(st, session, members, _incoming(content), t)
        revealed_b = set(st.get("revealed-b", [])) | set(survivors)
        revealed_s = set(st.get("revealed-s", [])) | set(dropped)
        if revealed_b & revealed_s:
            raise SecAggRefused(
                f"secagg: clients {sorted(revealed_b & revealed_s)} were named alive and dropped "
                "in this session; refused"
            )
        st["revealed-b"], st["revealed-s"] = sorted(revealed_b), sorted(revealed_s)
        st["members"] = members
        shares = {str(env.cid): st["own"], **st["received"]}
    items = {f"b/{j}": bytes.fromhex(shares[str(j)]["b"]) for j in survivors}
    items.update({f"s/{j}": bytes.fromhex(shares[str(j)]["s"]) for j in dropped})
    return _reply(content, env, items)


HANDLERS = {
    contract.KEYS: advertise,
    contract.SHARES: share,
    contract.CONSISTENCY: consistency,
    contract.UNMASK: unmask,
}
