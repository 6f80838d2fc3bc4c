"""Clustered FL (Sattler et al., 2020), as FedEM's reference code runs it as a baseline.

The server keeps a list of clusters of client ids, one model each; it starts with one cluster
holding every training client. Each round every client trains its cluster's model (the
FedAvg client, unchanged: each client's instruction carries its own cluster's weights). From
the updates dtheta_t = theta_t - theta_cluster the server splits every cluster that meets the
criterion (models/clustered.py), then averages each cluster's returned models with weights
n_t. A cluster with a member missing this round is not split (the member could not be placed).

Clients that connect after round 1 join the largest cluster. Unseen clients
(`unseen-fraction`) receive every cluster's model at the end and keep the one with the lowest
loss on their own training split.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import RecordDict

from models.clustered import flat_update, split_clusters, update_norms
from pollen.core import protocol
from pollen.core.contracts.clustered import CLUSTERS, ClusteredSettings
from pollen.core.contracts.fedem import pack, unpack
from strategies.aggregate import (
    aggregate_metrics,
    final_evaluation,
    num_examples,
    train_from,
    weighted_average,
)
from strategies.base import ClientInfo, Federation, Strategy
from strategies.classifier import initial_weights, parameter_keys
from strategies.privacy import PrivacyLedger
from strategies.robust import Combiner
from strategies.schedule import learning_rate


class Clustered(Strategy):
    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        clustered = ClusteredSettings.of(settings)
        self.tol1 = clustered.tol1
        self.tol2 = clustered.tol2
        self.max_norm = clustered.max_norm
        self.warmup = clustered.warmup_rounds
        self.clusters: list[list[int]] = []
        self.models: list[dict[str, np.ndarray]] = []
        self._keys: list[str] | None = None
        self.privacy = PrivacyLedger(settings)  # with DP-SGD: the clients' ledgers
        self.combiner = Combiner(settings)

    def initialize(self, seed: int) -> None:
        self.clusters = [[]]
        self.models = [initial_weights(self.settings, seed, self.model_fn)]

    def keys(self) -> list[str]:
        """The tensors an update is measured on: the trainable parameters."""
        if self._keys is None:
            self._keys = parameter_keys(self.settings, self.model_fn)
        return self._keys

    def cluster_of(self, cid: int) -> int:
        return next(k for k, members in enumerate(self.clusters) if cid in members)

    def admit(self, clients: list[ClientInfo]) -> None:
        """Clients in no cluster yet join the largest one (all of them in round 1)."""
        known = {c for members in self.clusters for c in members}
        largest = max(range(len(self.clusters)), key=lambda k: len(self.clusters[k]))
        self.clusters[largest] += [c.cid for c in clients if c.cid not in known]

    def run_round(self, fed: Federation) -> dict[str, float]:
        self.admit(fed.available())
        config = {"lr": learning_rate(self.settings, fed.server_round)}
        clients = fed.sample()
        sent = {c.cid: self.models[self.cluster_of(c.cid)] for c in clients}
        self.privacy.charge(clients)
        replies = train_from(fed, sent, config)
        trained = {cid: protocol.arrays_of(r) for cid, r in replies.items()}
        trained = self.combiner.attack_replies(fed.server_round, "models", trained, sent)
        updates = {cid: flat_update(sent[cid], m, self.keys()) for cid, m in trained.items()}

        before = self.clusters
        if fed.server_round > self.warmup:
            self.clusters = self._split(before, updates)
        parent = {cid: k for k, members in enumerate(before) for cid in members}
        models = []
        for k, members in enumerate(self.clusters):
            got = [c for c in members if c in trained]
            if not got:  # nobody of this cluster answered: its model stays
                models.append(self.models[parent[members[0]]])
            elif self.combiner.plain:
                models.append(
                    weighted_average(
                        [trained[c] for c in got], [num_examples(replies[c]) for c in got]
                    )
                )
            else:  # every member of a cluster was sent the same model: its parent's
                models.append(self.combiner.combine(
                    fed.server_round, f"cluster-{k}", {c: trained[c] for c in got},
                    sent[got[0]], {c: num_examples(replies[c]) for c in got}, attacked=True,
                ))  # fmt: skip
        self.models = models

        metrics = aggregate_metrics(replies)
        flat = np.stack(list(updates.values())) if updates else np.zeros((0, 0))
        mean, largest = update_norms(flat, self.max_norm)
        metrics.update({
            "clusters": float(len(self.clusters)),
            "splits": float(len(self.clusters) - len(before)),
            "mean-update-norm": mean,
            "max-update-norm": largest,
        })  # fmt: skip
        metrics.update(self.privacy.metrics())
        metrics.update(self.combiner.metrics())
        return metrics

    def _split(
        self, clusters: list[list[int]], updates: Mapping[int, np.ndarray]
    ) -> list[list[int]]:
        """The round's clustering step; under a robust rule its criterion is the robust one
        (models.clustered.update_norms) and no half smaller than the rule's minimum is made,
        so that robust.f members cannot trigger a split or be a cluster of their own."""
        if self.combiner.plain:
            return split_clusters(clusters, updates, self.tol1, self.tol2, self.max_norm)
        return split_clusters(
            clusters, updates, self.tol1, self.tol2, self.max_norm,
            f=self.combiner.robust.f, rule=self.combiner.aggregate_rows,
            min_size=self.combiner.rule_needs(),
        )  # fmt: skip

    def finalize(self, fed: Federation) -> dict[str, float]:
        self.admit(fed.available())
        by_size = sorted(range(len(self.models)), key=lambda k: -len(self.clusters[k]))
        every = pack([self.models[k] for k in by_size])

        def instruction(client: ClientInfo, unseen: bool) -> RecordDict:
            if unseen:
                config = {protocol.UNSEEN: True, CLUSTERS: len(by_size)}
                return protocol.instruction(fed.server_round, "evaluate", config, arrays=every)
            model = self.models[self.cluster_of(client.cid)]
            return protocol.instruction(
                fed.server_round, "evaluate", {protocol.UNSEEN: False}, arrays=model
            )

        out = final_evaluation(fed, instruction)
        out["clusters"] = float(len(self.clusters))
        return out

    def global_arrays(self) -> dict[str, np.ndarray]:
        """Every cluster's model, packed as `comp{k}.<key>` in cluster order."""
        return pack(self.models)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return pack(self.models), {"clusters": self.clusters, **self.privacy.state()}

    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        self.clusters = [[int(c) for c in members] for members in meta["clusters"]]
        self.models = unpack(dict(arrays), len(self.clusters))
        self.privacy.load_state(meta)
