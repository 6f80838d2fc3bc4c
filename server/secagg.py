"""The server's side of a secure sum (SecAgg+, Bell, Bonawitz, Gascón, Lepoint and Raykova,
CCS 2020): one phase of an algorithm run as four exchanges, after which the server knows the
sum of what the clients sent and each client's metrics, and nothing else of any reply
(docs/security.md#secure-aggregation; the stages: pollen.core.contracts.secagg).

Each stage is an ordinary `server.exchange.Phase`: sent packed to simulated nodes, sent again
when unanswered (every stage is answered alike when asked twice: client.secagg), timed out,
reported. A client lost at any stage is left out of the sum:

  before its shares went out   it is simply not in the sum;
  after, before its masked input arrived
                               its neighbours added masks agreed with it, which the server
                               removes by rebuilding its masking key from t of their shares;
  after its masked input       it is in the sum; its self mask is rebuilt from t shares.

The sum can be unmasked only while every client whose secret is needed keeps t shares among
the clients that answer the unmasking; when a stage leaves a client's neighbourhood with
fewer, the client is left out before anything of it is in the sum, and when the clients of
the sum can no longer be unmasked, fall into groups with no neighbours between them, hold fewer
than m clients or differ from an earlier sum of the same input by fewer than m (`SecAggSettings.
fewest`), the phase fails before any share is asked for: nothing is revealed. A client lost
during the unmasking itself can still leave too few shares after others were revealed, each a
share of one secret of a neighbour, never of both. The unmasked sum is checked before the
strategy sees it: a weight outside what the clients of the sum can carry means a client did not
follow the protocol.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from pollen.core import protocol
from pollen.core.contracts import secagg as contract
from pollen.core.contracts.secagg import Summing
from pollen.core.protection import SecAggSettings
from secagg import encoding, graph, keys, masks, noise
from server.exchange import Host, Phase, PhaseFailed
from strategies.base import InvalidReply, Secured, Summed


@dataclass(frozen=True)
class Advertised:
    """A client's answer to the keys stage."""

    c: bytes  # public key that seals the shares sent to it
    s: bytes  # public key that agrees its pairwise masks
    b_hash: bytes  # SHA-256 of the session and its self-mask seed
    v: bytes = b""  # the key that checks its signature on the sum's list (consistency round)
    digest: bytes = b""  # secagg.keys.bundle_digest of the above: the graph's seed is drawn from it
    node: dict[str, bytes] | None = None  # its node's signature on the digest and key id (a, p)


class SecureSum:
    """One phase of `message_type` run as a secure sum of what `summed` names."""

    def __init__(
        self,
        host: Host,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        summed: Summed,
        settings: SecAggSettings,
        modulus_bits: int,
        sizes: Mapping[int, int],
        min_replies: int | None = None,
        target: int | None = None,
        earlier: Collection[frozenset[int]] = (),
    ) -> None:
        self.host = host
        self.message_type = message_type
        self.payloads = payloads
        self.summed = summed
        self.settings = settings
        self.min_replies = min_replies
        self.target = target
        """Over-selection (docs/pacing.md): the masked replies the round wants; the masked
        stage closes once it has them and the others drop out, as a client lost there does."""
        self.cohort = sorted(payloads)
        self.fewest = settings.fewest()
        self.earlier = list(earlier)
        """The member sets of this round's earlier sums of the same phase (its input)."""
        self._parameters(len(self.cohort))
        self.neighbours: dict[int, frozenset[int]] = {}
        """The graph, drawn once the keys stage is answered (`_draw`)."""
        self.seed = b""
        self.session = f"{host.server_round}-{message_type}-{os.urandom(8).hex()}"
        self.layout = contract.layout_of(summed.records)
        self.size = contract.size_of(self.layout)
        self.enc = encoding.Encoding(summed.clip or settings.clip, settings.bits, modulus_bits)
        self.sizes = sizes
        """Each client's training examples (its hello): the weights it will report."""
        self.scale = max([sizes.get(c, 1) for c in self.cohort] + [1]) if summed.weighted else 1.0
        """Examples per unit of weight: every client's weight in the vector is at most 1."""
        self.failures: dict[int, str] = {}

    def _parameters(self, clients: int) -> None:
        """k and t for a graph of `clients`; PhaseFailed when the settings cannot give them."""
        try:
            self.k, self.t = self.settings.graph_for(clients)
        except ValueError as exc:
            raise PhaseFailed(
                f"round {self.host.server_round}, phase {self.message_type}: secure aggregation "
                f"over {clients} clients: {exc}"
            ) from None

    def _draw(self, advertised: Mapping[int, Advertised]) -> None:
        """The graph over the clients whose keys were taken, from the seed their keys give
        (secagg.graph.seed_of): every client draws it again and checks its neighbourhood."""
        self._parameters(len(advertised))
        self.seed = graph.seed_of(self.session, {c: a.digest for c, a in advertised.items()})
        self.neighbours = graph.neighbours(set(advertised), self.k, self.seed)

    # ---- the run ------------------------------------------------------------------------
    def run(self) -> Secured:
        if len(self.cohort) < 2:
            raise PhaseFailed(
                f"round {self.host.server_round}, phase {self.message_type}: secure aggregation "
                f"needs 2 clients at least, {len(self.cohort)} asked (a sum of one is that "
                "client's update)"
            )
        self._no_differencing("asked", set(self.cohort))
        advertised = self._keys()
        sealed = self._shares(advertised)
        masked, replies = self._masked(sealed)
        signatures = self._consistency(advertised, set(replies))
        total = self._unmask(advertised, sealed, masked, set(replies), signatures)
        return self._decoded(total, replies, len(sealed))

    def _no_differencing(self, what: str, members: set[int]) -> None:
        """PhaseFailed, before any share is revealed, when the sum would hold fewer than m
        clients, or differ from an earlier sum of the same input by fewer than m clients
        (client.secagg's rule, which every client enforces too): the difference of the two
        would give the input of those few away. A later sum of one input is over the same
        clients, or over a subset that leaves out m of them at least."""
        if len(members) < self.fewest:
            raise PhaseFailed(
                f"round {self.host.server_round}, phase {self.message_type}: secure aggregation "
                f"{what} {len(members)} clients, fewer than the {self.fewest} a sum may hold "
                "(secagg.min-clients, secagg.collusion); nothing is revealed"
            )
        for earlier in self.earlier:
            if members == earlier or (members <= earlier and len(earlier - members) >= self.fewest):
                continue
            raise PhaseFailed(
                f"round {self.host.server_round}, phase {self.message_type}: secure aggregation "
                f"{what} a set of clients that differs from an earlier sum of the same input by "
                f"fewer than {self.fewest} clients, or adds some; the difference of the two sums "
                "would give their input away, so this sum is not unmasked"
            )

    def _stage(
        self,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        validate: Callable[[int, RecordDict], None],
        record_clients: bool = False,
        fold: Callable[[int, RecordDict], None] | None = None,
        target: int | None = None,
        enough: Callable[[set[int]], bool] | None = None,
    ) -> dict[int, RecordDict]:
        answered, failures = Phase(
            self.host,
            message_type,
            payloads,
            validate,
            record_clients=record_clients,
            fold=fold,
            target=target,
            enough=enough,
        ).run()
        self.failures.update(failures)
        return {r.key: r.content for r in answered}

    def _instruction(
        self,
        message_type: str,
        config: Mapping[str, list[int]],
        items: Mapping[str, bytes] | None = None,
    ) -> RecordDict:
        """A stage's instruction: the session and `config`, and byte strings `items`."""
        content = protocol.instruction(self.host.server_round, message_type)
        content[contract.CONFIG] = ConfigRecord(
            {contract.SESSION: self.session, **config}  # type: ignore[dict-item]
        )
        if items is not None:
            content[contract.BYTES] = protocol.to_record(contract.to_bytes_record(items))
        return content

    def _keep(self, alive: set[int], stage: str) -> set[int]:
        """The clients of `alive` whose neighbourhood (themselves included) keeps t clients in
        `alive`, found again until no more drop: the others could never be unmasked, so they
        are left out now, each with the reason."""
        alive = set(alive)
        while True:
            short = {c for c in alive if len((self.neighbours[c] | {c}) & alive) < self.t}
            if not short:
                return alive
            for c in short:
                self.failures.setdefault(
                    c,
                    f"secure aggregation: after the {stage} stage fewer than {self.t} of its "
                    "neighbourhood remain to rebuild its secrets",
                )
            alive -= short

    def _require(self, stage: str, alive: Collection[int]) -> None:
        """PhaseFailed, with the reasons, unless enough clients remain for the sum."""
        needed = max(2, self.t)
        self.host.require(
            f"{self.message_type} ({stage})",
            len(alive),
            len(self.cohort),
            {c: r for c, r in self.failures.items() if c not in alive},
            self.min_replies,
        )
        if len(alive) < needed:
            reasons = "; ".join(f"client {c}: {r}" for c, r in sorted(self.failures.items()))
            raise PhaseFailed(
                f"round {self.host.server_round}, phase {self.message_type}: secure aggregation "
                f"kept {len(alive)} of {len(self.cohort)} clients after the {stage} stage, at "
                f"least {needed} needed; the sum is not unmasked and nothing of it is revealed"
                + (f" ({reasons})" if reasons else "")
            )

    # ---- stage 1: keys ------------------------------------------------------------------
    def _keys(self) -> dict[int, Advertised]:
        payloads = {
            c: self._instruction(contract.KEYS, {contract.COHORT: self.cohort})
            for c in self.cohort
        }
        out: dict[int, Advertised] = {}

        signed = self.settings.consistency

        def validate(cid: int, content: RecordDict) -> None:
            wanted = {"c", "s", "b-hash", *(("v",) if signed else ())}
            node = _byte_strings(content, wanted | {"a", "p"}, optional={"a", "p"})
            items = {n: node.pop(n) for n in wanted}
            if node and (set(node) != {"a", "p"} or len(node["p"]) != 32):
                raise InvalidReply("secagg: a node signature comes as 'a' and a 32-byte key id 'p'")
            for name in ("c", "s"):
                keys.public_key(items[name])
            if len(items["b-hash"]) != 32 or (signed and len(items["v"]) != 32):
                raise InvalidReply("secagg: the seed's hash or the signing key is not 32 bytes")
            digest = keys.bundle_digest(self.session, cid, items)
            out[cid] = Advertised(
                items["c"], items["s"], items["b-hash"], items.get("v", b""), digest, node or None
            )

        replies = self._stage(contract.KEYS, payloads, validate)
        alive = set(replies)
        advertised = {c: out[c] for c in alive}
        seen = [a.c for a in advertised.values()] + [a.s for a in advertised.values()]
        if len(set(seen)) != len(seen):
            raise PhaseFailed(
                f"round {self.host.server_round}, phase {self.message_type}: two clients "
                "advertised the same public key; secure aggregation stops"
            )
        if len(alive) >= 2:
            self._draw(advertised)
        self._require("keys", alive)
        return advertised

    # ---- stage 2: shares ----------------------------------------------------------------
    def _shares(self, advertised: Mapping[int, Advertised]) -> dict[int, dict[int, bytes]]:
        """Who sealed what for whom: sender -> {receiver: ciphertext}."""
        alive = set(advertised)
        members = sorted(alive)
        digests = b"".join(advertised[j].digest for j in members)
        payloads = {}
        for c in members:
            group = sorted(self.neighbours[c] | {c})
            public = {contract.DIGESTS: digests}
            for j in members:  # the node signatures, checked by clients that know the nodes
                node = advertised[j].node or {}
                public.update({f"{n}/{j}": v for n, v in node.items()})
            public.update({f"c/{j}": advertised[j].c for j in group})
            public.update({f"s/{j}": advertised[j].s for j in group})
            public.update({f"h/{j}": advertised[j].b_hash for j in group})
            if self.settings.consistency:
                public.update({f"v/{j}": advertised[j].v for j in group})
            payloads[c] = self._instruction(contract.SHARES, {contract.MEMBERS: members}, public)
        sealed: dict[int, dict[int, bytes]] = {}

        def validate(cid: int, content: RecordDict) -> None:
            wanted = {f"to/{j}" for j in self.neighbours[cid] & alive}
            items = _byte_strings(content, wanted)
            sealed[cid] = {int(name.removeprefix("to/")): ct for name, ct in items.items()}

        replies = self._stage(contract.SHARES, payloads, validate)
        kept = self._keep(set(replies), "shares")
        self._require("shares", kept)
        return {c: sealed[c] for c in kept}

    # ---- stage 3: the masked phase ------------------------------------------------------
    def _masked(
        self, sealed: Mapping[int, Mapping[int, bytes]]
    ) -> tuple[np.ndarray, dict[int, RecordDict]]:
        """The algorithm's phase with masked replies: their sum (each folded into it as it
        comes, in client order: the server holds one vector, not every client's) and the
        replies of the clients in it, without their arrays."""
        alive = set(sealed)
        summing = Summing(
            session=self.session,
            layout=self.layout,
            around=dict(self.summed.around),
            weighted=self.summed.weighted,
            weight_scale=self.scale,
            clip=self.enc.clip,
            bits=self.enc.bits,
            modulus_bits=self.enc.modulus_bits,
            l2_clip=self.summed.l2_clip,
            noise_variance=self._noise_variance(len(alive)),
        ).to_config()
        payloads = {}
        for c in sorted(alive):
            inbox = {f"from/{j}": sealed[j][c] for j in sorted(self.neighbours[c] & alive)}
            content = RecordDict(dict(self.payloads[c].items()))  # the strategy's, shared records
            content[contract.BYTES] = protocol.to_record(contract.to_bytes_record(inbox))
            content[contract.CONFIG] = summing
            payloads[c] = content
        total = np.zeros(self.size + 1, dtype=np.uint64)
        modulus = self.enc.modulus

        def validate(cid: int, content: RecordDict) -> None:
            extra = [
                n for n, r in content.items() if isinstance(r, ArrayRecord) and n != contract.MASKED
            ]
            if extra:
                raise InvalidReply(f"secagg: a masked reply also carries records {extra}")
            y = protocol.arrays_of(content, contract.MASKED, copy=False)
            if set(y) != {contract.Y}:
                raise InvalidReply("secagg: the masked record holds other arrays than 'y'")
            v = y[contract.Y]
            if v.dtype != self.enc.dtype or v.shape != (self.size + 1,):
                raise InvalidReply(
                    f"secagg: masked vector of {v.dtype} {v.shape}, expected {self.enc.dtype} "
                    f"({self.size + 1},)"
                )
            if self.enc.modulus_bits < v.dtype.itemsize * 8 and int(v.max(initial=0)) >= modulus:
                raise InvalidReply("secagg: a masked value is not below the modulus")

        def fold(_cid: int, content: RecordDict) -> None:
            nonlocal total
            v = protocol.arrays_of(content, contract.MASKED, copy=False)[contract.Y]
            total = encoding.add(total, v, self.enc)

        def enough(in_sum: set[int]) -> bool:
            """Over-selection closes the stage at `target` replies only where the sum can be
            unmasked: every secret to rebuild keeps t holders in it."""
            return all(
                len((self.neighbours[j] | {j}) & in_sum) >= self.t
                for j in self._to_rebuild(alive, in_sum)
            )

        replies = self._stage(
            self.message_type, payloads, validate, record_clients=True, fold=fold,
            target=self.target, enough=enough,
        )  # fmt: skip
        in_sum = set(replies)
        self._require("masked", in_sum)
        self._no_differencing("would sum", in_sum)
        parts = graph.components(self.neighbours, in_sum)
        if len(parts) > 1:
            raise PhaseFailed(
                f"round {self.host.server_round}, phase {self.message_type}: the clients of the "
                f"sum fall into {len(parts)} groups with no neighbours between them, whose sums "
                "the unmasking would give one by one; the sum is not unmasked and nothing of it "
                "is revealed"
            )
        # every secret to rebuild needs t shares among the clients in the sum: else stop now,
        # before any share is asked for
        for j in sorted(self._to_rebuild(alive, in_sum)):
            holders = (self.neighbours[j] | {j}) & in_sum
            if len(holders) < self.t:
                kind = "self mask" if j in in_sum else "masks with its neighbours"
                raise PhaseFailed(
                    f"round {self.host.server_round}, phase {self.message_type}: secure "
                    f"aggregation lost too many clients: client {j}'s {kind} needs {self.t} "
                    f"shares and {len(holders)} of its neighbourhood remain; the sum is not "
                    "unmasked and nothing of it is revealed"
                )
        return total, replies

    def _to_rebuild(self, shared: set[int], in_sum: set[int]) -> set[int]:
        """The clients whose secret the unmasking needs: the self-mask seed of each client in
        the sum, the masking key of each client that shared but dropped, where a neighbour of
        it in the sum added a mask agreed with it."""
        return in_sum | {j for j in shared - in_sum if self.neighbours[j] & in_sum}

    def _noise_variance(self, clients: int) -> float:
        """Each client's share of the distributed noise, in encoded units: of `clients` that
        shared keys, or with over-selection of the `target` first arrivals the sum keeps."""
        std = self.summed.noise_std
        if std <= 0:
            return 0.0
        return (std * self.enc.scale) ** 2 / self._noise_sharers(clients)

    def _noise_sharers(self, clients: int) -> int:
        """The clients among which the noise is shared out: those that shared keys, or with
        over-selection the `target` first arrivals the sum keeps."""
        return clients if self.target is None else min(clients, self.target)

    # ---- the consistency round ----------------------------------------------------------
    def _consistency(
        self, advertised: Mapping[int, Advertised], in_sum: set[int]
    ) -> dict[int, bytes]:
        """Each client of the sum's signature on its list (secagg.consistency; {} without):
        every client of the sum must then hold t signatures of its neighbourhood, or the round
        stops before any share is revealed."""
        if not self.settings.consistency:
            return {}
        members = sorted(in_sum)
        payloads = {
            c: self._instruction(contract.CONSISTENCY, {contract.SUM: members}) for c in members
        }
        signatures: dict[int, bytes] = {}

        def validate(cid: int, content: RecordDict) -> None:
            sig = _byte_strings(content, {"sig"})["sig"]
            if not keys.signed_members(advertised[cid].v, sig, self.session, self.seed, members):
                raise InvalidReply("secagg: the signature on the sum's list does not verify")
            signatures[cid] = sig

        signed = set(self._stage(contract.CONSISTENCY, payloads, validate))
        for c in members:
            have = len((self.neighbours[c] | {c}) & signed)
            if have < self.t:
                raise PhaseFailed(
                    f"round {self.host.server_round}, phase {self.message_type}: secure "
                    f"aggregation's consistency round left client {c} with {have} signatures of "
                    f"its neighbourhood, {self.t} needed; nothing of the sum is revealed"
                )
        return {c: signatures[c] for c in members if c in signed}

    # ---- stage 4: unmask ----------------------------------------------------------------
    def _unmask(
        self,
        advertised: Mapping[int, Advertised],
        sealed: Mapping[int, Mapping[int, bytes]],
        total: np.ndarray,
        in_sum: set[int],
        signatures: Mapping[int, bytes],
    ) -> np.ndarray:
        """The masked sum `total` of the clients `in_sum` without their masks: the shares the
        survivors reveal rebuild the self-mask seeds of the clients in it and the masking keys of
        those that shared but dropped."""
        shared = set(sealed)  # clients whose shares went out
        dropped = shared - in_sum
        payloads = {
            c: self._instruction(
                contract.UNMASK,
                {
                    contract.SURVIVORS: sorted((self.neighbours[c] | {c}) & in_sum),
                    contract.DROPPED: sorted(self.neighbours[c] & dropped),
                    contract.SUM: sorted(in_sum),
                },
                {f"sig/{j}": signatures[j] for j in sorted(self.neighbours[c]) if j in signatures}
                if signatures
                else None,
            )
            for c in sorted(in_sum)
        }
        held: dict[int, list[bytes]] = {j: [] for j in shared}

        def validate(cid: int, content: RecordDict) -> None:
            survivors = (self.neighbours[cid] | {cid}) & in_sum
            gone = self.neighbours[cid] & dropped
            wanted = {f"b/{j}" for j in survivors} | {f"s/{j}" for j in gone}
            items = _byte_strings(content, wanted)
            for name, share in items.items():
                held[int(name[2:])].append(share)

        self._stage(contract.UNMASK, payloads, validate)
        for j in sorted(self._to_rebuild(shared, in_sum)):
            if len(held[j]) < self.t:
                raise PhaseFailed(
                    f"round {self.host.server_round}, phase {self.message_type}: secure "
                    f"aggregation cannot unmask the sum: {len(held[j])} shares of client {j}'s "
                    f"secrets came back, {self.t} needed"
                )
            secret = keys.combine(held[j][: self.t])
            if j in in_sum:
                if keys.seed_hash(self.session, secret) != advertised[j].b_hash:
                    raise PhaseFailed(self._bad_shares(j, "self-mask seed"))
                own = masks.mask(masks.self_key(secret, self.session), self.size + 1,
                                 self.enc.modulus_bits)  # fmt: skip
                total = encoding.subtract(total, own, self.enc)
            else:
                try:
                    key = keys.private_key(secret)
                except keys.ShareError:
                    raise PhaseFailed(self._bad_shares(j, "masking key")) from None
                if keys.public_bytes(key) != advertised[j].s:
                    raise PhaseFailed(self._bad_shares(j, "masking key"))
                total = self._remove_pairwise(total, j, key, advertised, in_sum)
        return total

    def _remove_pairwise(
        self,
        total: np.ndarray,
        gone: int,
        key: keys.ec.EllipticCurvePrivateKey,
        advertised: Mapping[int, Advertised],
        in_sum: set[int],
    ) -> np.ndarray:
        """The sum without the masks a dropped client's neighbours in the sum added for it."""
        for i in sorted(self.neighbours[gone] & in_sum):
            agreed = keys.agreed_key(key, advertised[i].s)
            pair = masks.mask(masks.pairwise_key(agreed, self.session), self.size + 1,
                              self.enc.modulus_bits)  # fmt: skip
            # client i added sign(i, gone) x the mask: take it away
            if masks.pairwise_sign(i, gone) > 0:
                total = encoding.subtract(total, pair, self.enc)
            else:
                total = encoding.add(total, pair, self.enc)
        return total

    def _bad_shares(self, client: int, what: str) -> str:
        return (
            f"round {self.host.server_round}, phase {self.message_type}: the shares of client "
            f"{client}'s {what} do not rebuild what it advertised (a client sent wrong shares); "
            "secure aggregation stops"
        )

    def _decoded(self, total: np.ndarray, replies: dict[int, RecordDict], shared: int) -> Secured:
        """The unmasked sum decoded, once checked to be one the clients in it can have sent: a
        weight in (0, count] and every value within count x clip (and the noise's range)."""
        values, weight = encoding.decode(total, self.enc)
        count = len(replies)
        variance = self._noise_variance(shared) * count
        bound = count * self.enc.clip + noise.tail(variance) * self.enc.step + self.enc.step
        largest = float(np.abs(values).max(initial=0.0))
        if not 0 < weight <= count * (1 + 1e-12) or largest > bound:
            raise PhaseFailed(
                f"round {self.host.server_round}, phase {self.message_type}: the unmasked sum "
                f"of {count} clients carries a total weight of {weight:.6g} (at most {count}) "
                f"and values up to {largest:.6g} (at most {bound:.6g}): a client did not "
                "follow the protocol; the round stops"
            )
        release = None
        if variance > 0:  # distributed DP: one client's encoded update is the sensitivity
            l2 = encoding.rounded_l2_bound(self.summed.l2_clip, self.size, self.enc)
            l1 = min(np.sqrt(self.size) * l2, self.size * (self.enc.unit + 1.0))
            release = (float(variance), float(l1), float(l2))
        sums = contract.unflatten(values * self.scale, self.layout)
        if self.summed.weighted:  # each client's weight as it encodes its num-examples
            weights = {
                c: encoding.weight_units(self.sizes.get(c, 1) / self.scale, self.enc)
                / self.enc.unit
                * self.scale
                for c in replies
            }
        else:
            weights = dict.fromkeys(replies, 1.0)
        sharers = self._noise_sharers(shared)
        carried = self.summed.noise_std * np.sqrt(count / sharers) if shared else 0.0
        return Secured(
            replies={c: protocol.without_arrays(r) for c, r in sorted(replies.items())},
            sums=sums,
            weight=weight * self.scale,
            weights=weights,
            weight_scale=self.scale,
            noise_std=float(carried),
            release=release,
        )


def _byte_strings(
    content: RecordDict, wanted: set[str], optional: Collection[str] = ()
) -> dict[str, bytes]:
    """The reply's `secagg` byte strings, exactly the names `wanted` (those of `optional`
    may be missing)."""
    if contract.BYTES not in content:
        raise InvalidReply("secagg: the reply has no secagg record")
    try:
        items = contract.byte_strings(protocol.arrays_of(content, contract.BYTES, copy=False))
    except ValueError as exc:
        raise InvalidReply(f"secagg: {exc}") from None
    if set(items) != wanted and not set(wanted) - set(optional) <= set(items) <= wanted:
        extra, missing = sorted(set(items) - wanted), sorted(wanted - set(items))
        raise InvalidReply(f"secagg: the reply's entries differ (extra {extra}, missing {missing})")
    return items
