"""ADEPT server (Ozkara et al., AISTATS 2025): it holds the global model mu (V for PCA) and the
prior width sigma (one per weight for AE and DGM), and combines the clients' drifted copies of
both with equal weights 1/m ("sigma averaging": the plain elementwise mean of sigma itself).
For ADEPT-PCA the mean step of V is retracted onto the Stiefel manifold. Personal models never
leave the clients.

`adept.method` runs the baselines in the same framework: 'local' shares nothing, 'fedavg'
averages one model (sigma unused), 'fedavg-ft' switches to local fine-tuning after
`adept.tune-round`.

Byzantine robustness (`robust.*`, docs/robustness.md; strategies.robust.Combiner). With the
plain mean the round is bitwise today's. With a robust rule the server combines, for each
client, mu (V for PCA) and log sigma as one row (one joint combination: a selecting rule such
as Krum keeps the same clients for both), around the current mu and log sigma: the rule
applies to the updates mu_i - mu and log sigma_i - log sigma. sigma is combined in log space
so that it stays positive whatever the rule returns (exp of a robust mean of log sigma; the
paper's Alg. 1 and 2 average sigma itself, which the mean path keeps). For ADEPT-PCA the
combined V is retracted onto St(d, r) as the mean step is (Alg. 2's server step,
models.adept_pca.server_step). 'fedavg' and 'fedavg-ft' combine mu alone; 'local' shares
nothing, so nothing is combined.

One class per variant, named by its registry entry: ADEPTPCA, ADEPTAE and ADEPTDGM, which set
the class attributes `pca` and `denoiser` of the shared ADEPT.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import RecordDict

from models.adept_ae import average, theta_network
from models.adept_pca import server_step, server_update
from models.stiefel import random_point
from models.weights import get_weights
from pollen.core import protocol
from pollen.core.contracts.adept import (
    LR_GLOBAL,
    MU,
    SIGMA,
    AdeptAESettings,
    AdeptDGMSettings,
    AdeptPCASettings,
    AdeptSettings,
    shares,
)
from pollen.core.dataspec import model_input
from strategies.aggregate import aggregate_metrics, expect_arrays, final_evaluation
from strategies.base import Federation, InvalidReply, Strategy
from strategies.robust import Combiner
from strategies.schedule import learning_rate

_MU = f"{MU}/"  # mu's keys beside log sigma's in one robust combination
_LOG_SIGMA = f"log-{SIGMA}/"


def _positive_exp(log_sigma: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """exp(log sigma) in `dtype`, kept at or above sqrt of the smallest positive normal number
    (a mean of log sigma dragged down by attackers), so that sigma and sigma^2, which the
    clients divide by, stay positive."""
    floor = np.sqrt(np.finfo(dtype).tiny)
    out: np.ndarray = np.maximum(np.exp(log_sigma).astype(dtype), floor)
    return out


def initial_global_model(
    settings: Mapping[str, Any], seed: int, pca: bool, denoiser: bool
) -> dict[str, np.ndarray]:
    """The server's mu_0: a uniform point of St(d, r) for PCA, a fresh autoencoder for AE (with
    `denoiser`: a fresh UNet denoiser, DGM)."""
    shape, _ = model_input(settings)
    if pca:
        rank = AdeptPCASettings.of(settings).rank
        return {"V": random_point(int(np.prod(shape)), rank, np.random.default_rng(seed))}
    ae, dgm = AdeptAESettings.of(settings), AdeptDGMSettings.of(settings)
    torch.manual_seed(seed)
    network = theta_network(
        shape,
        denoiser,
        latent=ae.latent,
        channels=dgm.channels,
        kernel=dgm.kernel,
        architecture=ae.architecture,
    )
    return get_weights(network)


class ADEPT(Strategy):
    """The server of every ADEPT variant; the variant is set by the subclass (ADEPT itself is
    ADEPT-AE's)."""

    pca: ClassVar[bool] = False
    """mu is V on the Stiefel manifold and sigma one scalar (ADEPT-PCA), not a network's
    weights with one sigma each."""
    denoiser: ClassVar[bool] = False
    """The network is the UNet denoiser (ADEPT-DGM), not the linear autoencoder (ADEPT-AE)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.adept = AdeptSettings.of(settings)
        self.mu: dict[str, np.ndarray] = {}
        self.sigma: dict[str, np.ndarray] = {}
        self.combiner = Combiner(settings)

    def initialize(self, seed: int) -> None:
        self.mu = initial_global_model(self.settings, seed, self.pca, self.denoiser)
        sigma0 = self.adept.sigma_init
        if self.pca:  # one scalar sigma, as in the theory of ADEPT-PCA (sent as shape (1,))
            self.sigma = {"V": np.array([sigma0], dtype=np.float64)}
        else:  # one sigma per weight, as in every ADEPT-AE experiment
            self.sigma = {k: np.full_like(v, sigma0) for k, v in self.mu.items()}

    def validate(self, _cid: int, content: RecordDict) -> None:
        """Both records with the server's keys, shapes and dtypes, and sigma > 0."""
        if not self._shares(protocol.round_of(content)):
            return
        expect_arrays(content, MU, self.mu)
        for key, value in expect_arrays(content, SIGMA, self.sigma).items():
            if not (value > 0).all():
                raise InvalidReply(f"sigma.{key} has entries <= 0 (sigma must stay positive)")

    def _shares(self, server_round: int) -> bool:
        return shares(self.adept, server_round, self.run.num_rounds)

    def _instruction(self, server_round: int, message_type: str, **config: Any) -> RecordDict:
        return protocol.instruction(
            server_round,
            message_type,
            {"share": self._shares(server_round), **config},
            mu=self.mu,
            sigma=self.sigma,
        )

    def rates(self, server_round: int) -> dict[str, float]:
        """This round's learning rates under the run's `lr-schedule`: eta1 (`lr`) and eta2
        (`lr-global`, scaled by the same factor, as the authors' ADEPT-DGM schedule scales both
        of their Adams); eta3 (sigma) stays constant."""
        lr = learning_rate(self.settings, server_round)
        factor = lr / self.run.lr if self.run.lr > 0 else 1.0
        return {"lr": lr, LR_GLOBAL: self.adept.lr_global * factor}

    def run_round(self, fed: Federation) -> dict[str, float]:
        rnd = fed.server_round
        payloads = {c.cid: self._instruction(rnd, "train", **self.rates(rnd)) for c in fed.sample()}
        if self.combiner.secure and self._shares(rnd):
            replies = self._secure_update(fed, payloads)
            return {**aggregate_metrics(replies), **self.sigma_summary()}
        if not self.combiner.plain and self._shares(rnd):
            replies = fed.exchange(
                "train", payloads, self.validate, min_replies=self.combiner.min_replies()
            )
            if replies:
                self._robust_update(rnd, replies)
            return {**aggregate_metrics(replies), **self.sigma_summary(),
                    **self.combiner.metrics()}  # fmt: skip
        replies = fed.exchange("train", payloads, self.validate)
        if replies and self._shares(fed.server_round):
            mus = [protocol.arrays_of(r, MU) for r in replies.values()]
            if self.pca:
                self.mu = {"V": server_update(self.mu["V"], [m["V"] for m in mus])}
            else:
                self.mu = average(mus)
            if self.adept.method == "adept":
                self.sigma = average([protocol.arrays_of(r, SIGMA) for r in replies.values()])
        return {**aggregate_metrics(replies), **self.sigma_summary()}

    def _secure_update(
        self, fed: Federation, payloads: Mapping[int, RecordDict]
    ) -> dict[int, RecordDict]:
        """mu and sigma under secure aggregation: the server sees only the sums of the clients'
        mu_i - mu and sigma_i - sigma (around what each was sent; every client once, as the
        paper's 1/m average), and steps to their means: the mean step of the mean path, sigma
        averaged itself (kept above the smallest positive normal number, as a rounding of the
        sum could otherwise reach 0), V retracted onto St(d, r) for PCA."""
        records = {MU: self.mu, SIGMA: self.sigma}
        summed = self.combiner.summed(records, {MU: MU, SIGMA: SIGMA})
        secured = fed.secure_exchange(
            "train", payloads, summed, min_replies=self.combiner.min_replies()
        )
        new = self.combiner.secured(fed.server_round, "mu-sigma", secured, records)
        self.mu = {"V": server_step(self.mu["V"], new[MU]["V"])} if self.pca else new[MU]
        if self.adept.method == "adept":
            self.sigma = {
                k: np.maximum(v, np.sqrt(np.finfo(v.dtype).tiny)).astype(v.dtype)
                for k, v in new[SIGMA].items()
            }
        return secured.replies

    def _robust_update(self, server_round: int, replies: Mapping[int, RecordDict]) -> None:
        """mu and sigma by the robust rule: each client's (mu_i, log sigma_i) as one row around
        (mu, log sigma) (module docstring); unweighted, as the paper's 1/m average. For PCA the
        combined V is retracted onto St(d, r) (models.adept_pca.server_step)."""
        with_sigma = self.adept.method == "adept"

        def joint(
            mu: Mapping[str, np.ndarray], sigma: Mapping[str, np.ndarray]
        ) -> dict[str, np.ndarray]:
            out = {f"{_MU}{k}": v for k, v in mu.items()}
            if with_sigma:
                out.update(
                    {
                        f"{_LOG_SIGMA}{k}": np.log(np.asarray(v, np.float64))
                        for k, v in sigma.items()
                    }
                )
            return out

        rows = {
            cid: joint(
                protocol.arrays_of(r, MU), protocol.arrays_of(r, SIGMA) if with_sigma else {}
            )
            for cid, r in replies.items()
        }
        combined = self.combiner.combine(
            server_round, "mu-sigma", rows, joint(self.mu, self.sigma), None
        )
        mu = {k: combined[f"{_MU}{k}"] for k in self.mu}
        self.mu = {"V": server_step(self.mu["V"], mu["V"])} if self.pca else mu
        if with_sigma:
            self.sigma = {k: _positive_exp(combined[f"{_LOG_SIGMA}{k}"], v.dtype)
                          for k, v in self.sigma.items()}  # fmt: skip

    def sigma_summary(self) -> dict[str, float]:
        """Mean, min and max of sigma over all weights: the learned heterogeneity."""
        flat = np.concatenate([np.ravel(s) for s in self.sigma.values()])
        return {"sigma-mean": float(flat.mean()), "sigma-min": float(flat.min()),
                "sigma-max": float(flat.max())}  # fmt: skip

    def finalize(self, fed: Federation) -> dict[str, float]:
        out = final_evaluation(
            fed,
            lambda c, new: self._instruction(fed.server_round, "evaluate", unseen=new),
        )
        return {**out, **self.sigma_summary()}

    def global_arrays(self) -> dict[str, np.ndarray]:
        return self.mu

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {f"{MU}.{k}": v for k, v in self.mu.items()}
        arrays.update({f"{SIGMA}.{k}": v for k, v in self.sigma.items()})
        return arrays, {}

    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        self.mu = {k.removeprefix(f"{MU}."): v for k, v in arrays.items() if k.startswith(f"{MU}.")}
        self.sigma = {
            k.removeprefix(f"{SIGMA}."): v for k, v in arrays.items() if k.startswith(f"{SIGMA}.")
        }


class ADEPTPCA(ADEPT):
    """ADEPT-PCA: personal subspaces U_i, a global V on St(d, r), one scalar sigma."""

    pca = True


class ADEPTAE(ADEPT):
    """ADEPT-AE: personal linear autoencoders, a global mu and one sigma per weight."""


class ADEPTDGM(ADEPT):
    """ADEPT-DGM: personal UNet denoisers, a global mu and one sigma per weight."""

    denoiser = True
