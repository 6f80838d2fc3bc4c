"""D-FedEM (Marfoq et al., 2021, Alg. 4): FedEM without a global model.

Every client keeps its own M components. Each round a client starts from the gossip average of
its neighbours' latest models, sum_s w_st theta_s, on a fixed connected Erdős–Rényi graph
with Metropolis-Hastings weights, then runs the FedEM client step (E-step, pi, weighted
training). The server is only the medium the gossip travels through: it keeps each client's
latest models and forms, for each client, the weighted sum over that client's neighbourhood.
It never averages over all clients and no global model exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pollen.core import protocol
from pollen.core.contracts.fedem import DFedEMSettings, FedEMSettings, pack
from strategies.aggregate import aggregate_metrics, honest, train_from
from strategies.base import Federation, Strategy
from strategies.classifier import initial_weights
from strategies.gossip import clipped_gossip, erdos_renyi, metropolis_hastings
from strategies.privacy import PrivacyLedger
from strategies.robust import Combiner
from strategies.schedule import learning_rate


class DFedEM(Strategy):
    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.num_clients = self.run.num_clients
        self.num = FedEMSettings.of(settings).components
        self.edge_probability = DFedEMSettings.of(settings).edge_probability
        self.models: list[dict[str, np.ndarray]] = []  # client t's latest components
        self.mixing = np.eye(self.num_clients)
        self.privacy = PrivacyLedger(settings, passes=self.num)  # each component spends
        self.combiner = Combiner(settings)

    def initialize(self, seed: int) -> None:
        start = pack(
            [initial_weights(self.settings, seed + m, self.model_fn) for m in range(self.num)]
        )
        self.models = [dict(start) for _ in range(self.num_clients)]
        rng = np.random.default_rng([seed, 0xD])
        adjacency = erdos_renyi(self.num_clients, self.edge_probability, rng)
        self.mixing = metropolis_hastings(adjacency)

    def gossip(self, cid: int) -> dict[str, np.ndarray]:
        """sum_s w_st theta_s over client t's neighbourhood (itself included); under
        robust.rule=centered-clip, or mean with robust.clip, ClippedGossip (strategies.gossip:
        each neighbour's difference to t's own model clipped to robust.tau / robust.clip, or
        to the adaptive radius)."""
        robust = self.combiner.robust
        if robust.rule == "centered-clip" or robust.clip > 0:
            tau = robust.clip if robust.rule == "mean" else (robust.tau or None)
            return clipped_gossip(self.models, self.mixing, cid, tau, robust.f)
        neighbours = np.flatnonzero(self.mixing[:, cid])
        out = {}
        for key in self.models[cid]:
            stacked = np.stack([self.models[s][key].astype(np.float64) for s in neighbours])
            mixed = np.tensordot(self.mixing[neighbours, cid], stacked, axes=1)
            out[key] = mixed.astype(self.models[cid][key].dtype)
        return out

    def run_round(self, fed: Federation) -> dict[str, float]:
        config = {"lr": learning_rate(self.settings, fed.server_round)}
        clients = fed.available()
        starts = {c.cid: self.gossip(c.cid) for c in clients}
        self.privacy.charge(clients)
        replies = train_from(fed, starts, config)
        trained = {cid: protocol.arrays_of(reply) for cid, reply in replies.items()}
        trained = self.combiner.attack_replies(fed.server_round, "models", trained, starts)
        for cid, model in trained.items():
            self.models[cid] = model
        # a client that did not answer keeps its gossip start as its latest model
        for cid, start in starts.items():
            if cid not in replies:
                self.models[cid] = start
        metrics = aggregate_metrics(replies)
        metrics["consensus-distance"] = self.consensus_distance()
        metrics.update(self.privacy.metrics())
        metrics.update(self.combiner.metrics())
        return metrics

    def consensus_distance(self) -> float:
        """mean_t ||theta_t - mean_s theta_s||^2: how far the clients are from agreeing."""
        keys = list(self.models[0])
        flat = np.stack(
            [np.concatenate([m[k].ravel().astype(np.float64) for k in keys]) for m in self.models]
        )
        return float(((flat - flat.mean(axis=0)) ** 2).sum(axis=1).mean())

    def finalize(self, fed: Federation) -> dict[str, float]:
        payloads = {
            c.cid: protocol.instruction(fed.server_round, "evaluate", arrays=self.gossip(c.cid))
            for c in fed.available()
        }
        return aggregate_metrics(honest(fed, fed.exchange("evaluate", payloads)))

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {f"client{t}/{k}": v for t, m in enumerate(self.models) for k, v in m.items()}
        arrays["mixing"] = self.mixing
        return arrays, self.privacy.state()

    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        self.mixing = np.asarray(arrays["mixing"])
        self.privacy.load_state(meta)
        self.models = [{} for _ in range(self.num_clients)]
        for key, value in arrays.items():
            if key.startswith("client"):
                head, _, rest = key.partition("/")
                self.models[int(head.removeprefix("client"))][rest] = value
