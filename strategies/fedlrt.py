"""FeDLRT (Schotthöfer & Laiu, 2024) and FedLin (Mitra et al., 2021): rounds of two or three
phases, variance-corrected local training.

FeDLRT keeps the chosen linear layers as W = U diag(s) V^T (float64 on the server). A round:
  basis phase     clients get U, s, V (and the dense parameters) and answer the full local
                  gradients w.r.t. U and V (+ S for simplified correction, + the dense
                  parameters for their FedLin correction); the server averages them and augments
                  each basis by QR: Ū, V̄ (the r new columns).
  coef-grad phase (full correction only) clients get Ū, V̄ and answer ∇_S̃ L_c at the round's
                  start point.
  train phase     clients get Ū, V̄ (unless sent already) and their own correction
                  V_c = G − G_c, train S̃ (2r×2r) and the dense parameters with U, V frozen and
                  answer them; the server averages S̃, truncates it by SVD and averages the rest.
With `fedlrt.warm-start` = k > 0, round 1 starts with a warm start (the paper's ResNet-18 runs,
§4.2: "warm-started with 5 iterations with one client"): the first available client takes k
mini-batch SGD steps on the dense initial model, and the server factorizes the result.
Clients keep U, s, V (and Ū, V̄) of the round in their state store between phases, so only the
new columns travel. A client lost in the train phase makes the server redo the coefficient
phases with the others (see run_round), so the corrections always sum to zero over the clients
averaged. FedLin is the same round with no factorized layer: a gradient phase, then
corrected local training of the whole model.

Byzantine robustness (`robust.*`, docs/robustness.md; strategies.robust.Combiner). With the
plain mean the round is bitwise today's. With a robust rule, every point where clients are
combined goes through the rule:
  basis gradients   the basis-phase gradients (w.r.t. U and V, and S and the dense parameters
                    when they are sent for the corrections) are combined as one row per client
                    (reference 0: they are gradients) into the robust G; Ū, V̄ augment the
                    bases with G's range only (the paper's Alg. 1, basis augmentation), so
                    one client's gradient cannot inject a direction into the basis.
  corrections       V_c = G − G_c is built from that same robust G (full correction: the
                    coef-grad phase's ∇_S̃ and the dense gradients, combined jointly over the
                    clients that answered it). Under the mean Σ_c w_c V_c = 0, so the
                    corrections change no client's average drift (the paper's eq. 8, 9 and
                    Thm. 1); under a robust rule G is not the weighted mean of the G_c, so the
                    corrections no longer sum to zero exactly: they move every client towards
                    the robust consensus gradient instead of the (attackable) mean, and the
                    variance-correction guarantee holds for the honest clients only in as much
                    as the rule is close to their mean.
  train phase       S̃ and the dense parameters, one joint combination (a selecting rule such
                    as Krum keeps the same clients for both), reference what every client
                    started from: S̃ = [[diag(s), 0], [0, 0]] (models.fedlrt.padded_coefficients
                    of the s it received in float32) and the current dense parameters; the
                    truncation by SVD follows as today.

Secure aggregation (`secagg.*`, docs/security.md#secure-aggregation): every combination of the
round is a weighted mean (weights n_c), so the server asks for sums only: the basis gradients
(G, from which Ū, V̄ come as in the plain round), the coef-grad phase's ∇_S̃ and the train
phase's updates of S̃ and the dense parameters around the point every client started from
(sent as `start`). The corrections V_c = G − G_c need each client's own gradient, which the
server no longer sees: it sends G itself (`mean-grads`) and each client, which kept its G_c
(`own-correction`), corrects by the difference. A client lost after the basis phase leaves
the sums over different clients; the round then starts again from the basis phase with the
clients still in every sum less m more (`SecAggSettings.fewest`): the same gradients summed
over the clients less the lost one alone would give the server that client's gradient.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np
from flwr.app import RecordDict

from models.fedlrt import (
    Factors,
    augmentation_width,
    augmented_bases,
    coefficient_start,
    factorize,
    max_rank,
    orthonormality_error,
    round_floats,
    truncate,
)
from models.lowrank import load_low_rank, select_layers
from pollen.core import protocol
from pollen.core.contracts import fedlrt as contract
from pollen.core.contracts.fedlrt import (
    BASES,
    CORRECTIONS,
    GRADS,
    MEAN_GRADS,
    START,
    FeDLRTSettings,
)
from pollen.core.protection import resummed
from pollen.core.runmodel import run_model
from pollen.core.settings import Scalar
from strategies.aggregate import (
    Traffic,
    aggregate_metrics,
    expect_arrays,
    final_evaluation,
    num_examples,
    weighted_average,
)
from strategies.base import Federation, InitialArraysError, Secured, Strategy, layout_mismatch
from strategies.classifier import ServerEvaluator, initial_weights
from strategies.robust import Combiner
from strategies.schedule import learning_rate


def _spec(shape: tuple[int, ...]) -> np.ndarray:
    """A float32 placeholder of the shape a reply array must have (for expect_arrays)."""
    return np.zeros(shape, np.float32)


def _mean64(
    arrays: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> dict[str, np.ndarray]:
    """Weighted mean kept in float64: the server's QR and SVD work on it."""
    return weighted_average(
        [{k: v.astype(np.float64) for k, v in a.items()} for a in arrays], weights
    )


def _as64(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays in float64, so that a robust combination of them comes back in float64."""
    return {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}


def _as32(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The layout of a train-phase reply: float arrays in float32, as the clients send them."""
    return {
        k: np.asarray(v, np.float32) if np.asarray(v).dtype.kind == "f" else np.asarray(v)
        for k, v in arrays.items()
    }


class FeDLRT(Strategy):
    warm_phase = contract.WARM_START
    basis_phase = contract.BASIS
    coef_phase = contract.COEF_GRAD
    train_phase = contract.TRAIN

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.fedlrt = FeDLRTSettings.of(settings)
        self.var_cor = self.fedlrt.var_cor
        self.dense_correction = self.var_cor != "none" and self.fedlrt.dense_correction
        self.tau = self.fedlrt.tau
        self.relative = self.fedlrt.truncation == "relative"
        self.dense: dict[str, np.ndarray] = {}
        self.factors: dict[str, Factors] = {}
        self._warm_start_from: dict[str, np.ndarray] | None = None
        """The dense initial model a pending warm start trains (None: no warm start due)."""
        self._evaluator = ServerEvaluator(settings, load=_load_low_rank)
        self.combiner = Combiner(settings)
        """How clients are combined at each point (module docstring); `plain`: today's mean."""

    # ---- the model ---------------------------------------------------------------------
    def _dense_model(self) -> Any:
        return run_model(self.settings, self.model_fn)

    def layer_names(self) -> list[str]:
        return select_layers(self._dense_model(), self.fedlrt.layers)

    @cached_property
    def dense_parameters(self) -> list[str]:
        """Trainable parameters that stay dense (the ones a FedLin correction applies to)."""
        factorized = set(self.factors)
        return [
            name
            for name, _ in self._dense_model().named_parameters()
            if name.rpartition(".")[0] not in factorized or not name.endswith(".weight")
        ]

    def rank_cap(self, name: str) -> int:
        fac = self.factors[name]
        return max_rank(fac.U.shape[0], fac.V.shape[0], self.fedlrt.max_rank)

    def initialize(self, seed: int) -> None:
        weights = initial_weights(self.settings, seed, self.model_fn)
        self._warm_start_from = dict(weights) if self.fedlrt.warm_start else None
        self._start_from(weights)

    def start_from(self, arrays: Mapping[str, np.ndarray]) -> None:
        """A dense model (a Flower app's initial arrays): the layers factorized at the initial
        rank, as `initialize` does with the model it builds."""
        dense = initial_weights(self.settings, 0, self.model_fn)
        reason = layout_mismatch(arrays, dense)
        if reason:
            raise InitialArraysError(f"the initial arrays do not fit the dense model: {reason}")
        weights = {k: np.asarray(arrays[k], dtype=v.dtype) for k, v in dense.items()}
        self._warm_start_from = dict(weights) if self.fedlrt.warm_start else None
        self._start_from(weights)

    def _start_from(self, weights: dict[str, np.ndarray]) -> None:
        """The global model from dense weights: the chosen layers factorized at the initial
        rank (truncated SVD), the other parameters kept dense."""
        weights = dict(weights)
        self.factors = {}
        for name in self.layer_names():
            w = weights.pop(f"{name}.weight").astype(np.float64)
            top = max_rank(w.shape[0], w.shape[1], self.fedlrt.max_rank)
            wanted = self.fedlrt.rank or top
            self.factors[name] = factorize(w, min(wanted, top))
        self.dense = weights

    def global_arrays(self) -> dict[str, np.ndarray]:
        """What clients receive in the basis phase: dense parameters and U, s, V in float32."""
        out = dict(self.dense)
        for name, fac in self.factors.items():
            out.update({f"{name}.U": fac.U, f"{name}.s": fac.s, f"{name}.V": fac.V})
        return {k: np.asarray(v, dtype=np.float32) for k, v in out.items()}

    def model_arrays(self) -> list[dict[str, np.ndarray]]:
        """The dense model: each factorized layer's weight U diag(s) V^T, in the model's order."""
        weights = {f"{name}.weight": fac.dense() for name, fac in self.factors.items()}
        weights.update(self.dense)
        order = [k for k in self._dense_model().state_dict() if k in weights]
        return [{k: np.asarray(weights[k], dtype=np.float32) for k in order}]

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = dict(self.dense)
        for name, fac in self.factors.items():
            arrays.update({f"{name}.U": fac.U, f"{name}.s": fac.s, f"{name}.V": fac.V})
        return arrays, {"factorized": sorted(self.factors)}

    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        self._warm_start_from = None  # a checkpoint comes after round 1, warm start included
        names = list(meta.get("factorized", []))
        self.factors = {
            n: Factors(arrays[f"{n}.U"], arrays[f"{n}.s"], arrays[f"{n}.V"]) for n in names
        }
        keys = {f"{n}{suffix}" for n in names for suffix in (".U", ".s", ".V")}
        self.dense = {k: v for k, v in arrays.items() if k not in keys}

    # ---- a round -------------------------------------------------------------------------
    def run_round(self, fed: Federation) -> dict[str, float]:
        """One round. The corrections V_c = G − G_c sum to zero (weighted) only over the clients
        whose gradients G is the mean of; a client that fails in the train phase, after its
        correction went out, would leave the others' corrections biased. The round is then
        restarted with the clients that answered: their basis-phase replies are reused
        (gradients at the same point), so Ū, V̄, G and every V_c are recomputed over
        them, and the coefficient phases are repeated. The update equals that of a round in
        which only they had been sampled. Without corrections a failure needs no restart."""
        rnd = fed.server_round
        config: dict[str, Scalar] = {
            "lr": learning_rate(self.settings, rnd),
            contract.VAR_COR: self.var_cor,
            contract.DENSE_GRADS: self.dense_correction,
        }
        warm = self._warm_start(fed, config) if self._warm_start_from is not None else {}
        if self.combiner.secure:
            return warm | self._secure_round(fed, config)
        traffic = Traffic()

        # basis phase: gradients at the current point
        down = protocol.to_record(self.global_arrays())
        payloads = protocol.to_each(
            (c.cid for c in fed.sample()),
            protocol.instruction(rnd, self.basis_phase, config, arrays=down),
        )
        basis = fed.exchange(
            self.basis_phase, payloads, self._check_basis, min_replies=self._min_replies()
        )
        traffic.add("basis", payloads, basis)
        members = list(basis)
        restarts = 0
        while True:
            bars, participants, trained = self._coefficient_phases(
                fed, config, traffic, {c: basis[c] for c in members}
            )
            if not self._corrected or len(trained) == len(participants):
                break
            members = [c for c in participants if c in trained]
            restarts += 1
        basis = {c: basis[c] for c in members}
        if self.combiner.plain:
            models = [protocol.arrays_of(r) for r in trained.values()]
            counts = [num_examples(r) for r in trained.values()]
            coefficients = _mean64(
                [{f"{n}.S": m[f"{n}.S"] for n in self.factors} for m in models], counts
            )
            dense = weighted_average([{k: m[k] for k in self.dense} for m in models], counts)
        else:
            coefficients, dense = self._robust_train(rnd, bars, trained)

        metrics = {**warm, **aggregate_metrics(basis), **aggregate_metrics(trained)}
        metrics.update(traffic.metrics())
        metrics["restarts"] = float(restarts)
        return metrics | self._step(bars, coefficients, dense)

    def _step(
        self,
        bars: Mapping[str, tuple[np.ndarray, np.ndarray]],
        coefficients: Mapping[str, np.ndarray],
        dense: dict[str, np.ndarray],
    ) -> dict[str, float]:
        """The new factors from the augmented bases and the combined S̃ (truncated by SVD),
        and the new dense parameters; the metrics of the truncation."""
        metrics = self.formula_bytes()
        ortho = 0.0
        for name in list(self.factors):
            u_aug = np.hstack([self.factors[name].U, bars[name][0]])
            v_aug = np.hstack([self.factors[name].V, bars[name][1]])
            cut = truncate(u_aug, coefficients[f"{name}.S"], v_aug, self.tau, self.relative,
                           self.fedlrt.min_rank, self.rank_cap(name))  # fmt: skip
            self.factors[name] = cut.factors
            metrics[f"truncation-ratio-{name}"] = (
                cut.discarded / cut.threshold if cut.threshold > 0 else 0.0
            )
            ortho = max(ortho, orthonormality_error(cut.factors.U),
                        orthonormality_error(cut.factors.V))  # fmt: skip
            metrics[f"rank-{name}"] = float(cut.factors.rank)
        self.dense = dense
        if self.factors:
            metrics["orthonormality-error"] = ortho
        metrics.update(self.combiner.metrics())
        return metrics

    def _secure_round(self, fed: Federation, config: dict[str, Scalar]) -> dict[str, float]:
        """A round under secure aggregation (module docstring): each phase a secure sum over the
        same clients; one lost, the round starts again with the others in every sum less m."""
        rnd = fed.server_round
        config = {**config, contract.OWN_CORRECTION: True}
        members = [c.cid for c in fed.sample()]
        down = {protocol.ARRAYS: protocol.to_record(self.global_arrays())}
        restarts = 0
        while True:
            if restarts:  # the clients left less m more (module docstring)
                members = resummed(self.settings, members, (self.run.seed, rnd, restarts))
            basis = self._secure_phase(
                fed, self.basis_phase, config, members, {GRADS: self._basis_grads()}, down
            )
            grads = basis.mean(GRADS)
            bars = augmented_bases(self.factors, grads)
            own_keys = list(self.dense_parameters) if self.dense_correction else []
            if self.var_cor == "simplified":
                own_keys += [f"{n}.S" for n in self.factors]
            mean_own = {k: grads[k] for k in own_keys} if self._corrected else {}
            members = basis.clients
            arrays: dict[str, Any] = {BASES: self._wire_bases(bars)}
            if self.var_cor == "full" and self.factors:
                coef = self._secure_phase(
                    fed, self.coef_phase, config, members, {GRADS: self._augmented()}, arrays
                )
                mean_own.update(coef.mean(GRADS))
                arrays = {}  # the clients keep the bases they got
                if set(coef.clients) != set(members):
                    members, restarts = coef.clients, restarts + 1
                    continue
            if mean_own:
                arrays[MEAN_GRADS] = mean_own
            start = coefficient_start(self.factors, bars, self.dense)
            arrays[START] = start
            trained = self._secure_phase(
                fed, self.train_phase, config, members, {protocol.ARRAYS: _as32(start)}, arrays,
                around={protocol.ARRAYS: START},
            )  # fmt: skip
            if not self._corrected or set(trained.clients) == set(members):
                break
            members, restarts = trained.clients, restarts + 1
        new = self.combiner.secured(rnd, "coefficients", trained, {protocol.ARRAYS: start})
        combined = new[protocol.ARRAYS]
        coefficients = {f"{n}.S": combined[f"{n}.S"] for n in self.factors}
        metrics = {**aggregate_metrics(basis.replies), **aggregate_metrics(trained.replies)}
        metrics["restarts"] = float(restarts)
        return metrics | self._step(bars, coefficients, {k: combined[k] for k in self.dense})

    def _secure_phase(
        self,
        fed: Federation,
        phase: str,
        config: Mapping[str, Scalar],
        members: Sequence[int],
        records: Mapping[str, Mapping[str, np.ndarray]],
        arrays: Mapping[str, Any] | None = None,
        around: Mapping[str, str] | None = None,
    ) -> Secured:
        """One phase of the round as a secure sum over `members`, weighted by n_c, of the
        replies' `records` (around the instruction's records `around` names)."""
        content = protocol.instruction(fed.server_round, phase, config, **(arrays or {}))
        summed = self.combiner.summed(records, around, weighted=True)
        return fed.secure_exchange(phase, protocol.to_each(members, content), summed)

    def _wire_bases(
        self, bars: Mapping[str, tuple[np.ndarray, np.ndarray]]
    ) -> dict[str, np.ndarray]:
        """The new columns Ū, V̄ of every layer as the clients get them (float32)."""
        return {
            f"{name}.{side}": b.astype(np.float32)
            for name, (ub, vb) in bars.items()
            for side, b in ((contract.UBAR, ub), (contract.VBAR, vb))
        }

    def _min_replies(self) -> int | None:
        """The replies a phase needs: the robust rule's minimum, or the run's (None) for the
        plain mean."""
        return None if self.combiner.plain else self.combiner.min_replies()

    def _robust_train(
        self,
        server_round: int,
        bars: Mapping[str, tuple[np.ndarray, np.ndarray]],
        trained: Mapping[int, RecordDict],
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(S̃ per layer in float64, the dense parameters) by the robust rule, as one joint
        combination of each client's train-phase reply around what it started from: S̃_0 =
        [[diag(s), 0], [0, 0]] with the s it received (float32, `global_arrays`; the client's
        `_augmented`) and the current dense parameters (the paper's Alg. 1, aggregation of S̃)."""
        start = coefficient_start(self.factors, bars, self.dense)
        combined = self.combiner.combine(
            server_round,
            "coefficients",
            {cid: protocol.arrays_of(r) for cid, r in trained.items()},
            start,
            {cid: num_examples(r) for cid, r in trained.items()},
        )
        coefficients = {f"{n}.S": combined[f"{n}.S"] for n in self.factors}
        return coefficients, {k: combined[k] for k in self.dense}

    def _warm_start(self, fed: Federation, config: Mapping[str, Scalar]) -> dict[str, float]:
        """The warm start: the first available client trains the dense initial model for
        `fedlrt.warm-start` mini-batch steps (this round's learning rate); the global model
        becomes its reply, factorized. Its metrics come back prefixed `warm-start-`."""
        assert self._warm_start_from is not None
        start = self._warm_start_from
        first = fed.available()[0]
        payload = protocol.instruction(
            fed.server_round,
            self.warm_phase,
            {"lr": config["lr"], contract.STEPS: self.fedlrt.warm_start},
            arrays=protocol.to_record(start),
        )

        def check(_cid: int, content: RecordDict) -> None:
            expect_arrays(content, protocol.ARRAYS, start)

        reply = fed.exchange(self.warm_phase, {first.cid: payload}, check, min_replies=1)
        self._start_from(protocol.arrays_of(reply[first.cid]))
        self._warm_start_from = None
        metrics = aggregate_metrics(reply)
        return {f"warm-start-{k}": v for k, v in metrics.items()} | {
            "warm-start-client": float(first.cid)
        }

    @property
    def _corrected(self) -> bool:
        """Whether clients get corrections (then every average must be over the same clients)."""
        return self.var_cor != "none" and (bool(self.factors) or self.dense_correction)

    def _coefficient_phases(
        self,
        fed: Federation,
        config: dict[str, Scalar],
        traffic: Traffic,
        basis: Mapping[int, RecordDict],
    ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[int], dict[int, RecordDict]]:
        """Augmentation from the given basis replies, the coef-grad phase (full correction) and
        the train phase: (Ū, V̄ per layer, the clients sent a train instruction, their valid
        replies)."""
        rnd = fed.server_round
        weight = {cid: float(num_examples(r)) for cid, r in basis.items()}
        grads = {cid: protocol.arrays_of(r, GRADS) for cid, r in basis.items()}
        robust = not self.combiner.plain
        if robust:  # the robust G: one row per client, every gradient it sent (reference 0)
            mean = self.combiner.combine(
                rnd, "basis-gradients", {c: _as64(g) for c, g in grads.items()}, None, weight
            )
        else:
            mean = _mean64(list(grads.values()), list(weight.values()))
        bars = augmented_bases(self.factors, mean)
        bases = self._wire_bases(bars)

        # the client gradients the corrections are built from
        dense_keys = self.dense_parameters if self.dense_correction else []
        own = {cid: {k: g[k] for k in dense_keys} for cid, g in grads.items()}
        if self.var_cor == "simplified":
            for cid, g in grads.items():
                own[cid].update({f"{n}.S": g[f"{n}.S"] for n in self.factors})
        if self.var_cor == "full" and self.factors:
            payloads = protocol.to_each(
                basis, protocol.instruction(rnd, self.coef_phase, config, **{BASES: bases})
            )
            coef = fed.exchange(
                self.coef_phase, payloads, self._check_coef, min_replies=self._min_replies()
            )
            traffic.add("coef-grad", payloads, coef)
            for cid, r in coef.items():
                own[cid].update(protocol.arrays_of(r, GRADS))
            own = {cid: own[cid] for cid in coef}
        participants = list(own)
        keys = list(own[participants[0]]) if participants else []
        if not robust:
            mean_own = _mean64([own[c] for c in participants], [weight[c] for c in participants])
        elif not keys:
            mean_own = {}
        elif self.var_cor == "full" and self.factors:  # ∇_S̃ comes from the coef-grad phase
            mean_own = self.combiner.combine(
                rnd,
                "correction-gradients",
                {c: _as64(own[c]) for c in participants},
                None,
                {c: weight[c] for c in participants},
            )
        else:  # the same clients and gradients as the basis: the same robust G
            mean_own = {k: mean[k] for k in keys}

        # train phase: corrected coefficient (and dense) training
        payloads = {}
        for cid in participants:
            arrays: dict[str, Any] = {}
            if not (self.var_cor == "full" and self.factors):
                arrays[BASES] = bases
            if mean_own:
                arrays[CORRECTIONS] = {
                    k: (mean_own[k] - own[cid][k]).astype(np.float32) for k in mean_own
                }
            payloads[cid] = protocol.instruction(rnd, self.train_phase, config, **arrays)
        trained = fed.exchange(
            self.train_phase, payloads, self._check_train, min_replies=self._min_replies()
        )
        traffic.add("train", payloads, trained)
        return bars, participants, trained

    # ---- reply checks --------------------------------------------------------------------
    def _basis_grads(self) -> dict[str, np.ndarray]:
        """The layout of the basis phase's gradients (float32 placeholders)."""
        ref = (
            {k: _spec(self.dense[k].shape) for k in self.dense_parameters}
            if self.dense_correction
            else {}
        )
        for name, fac in self.factors.items():
            ref[f"{name}.U"] = _spec(fac.U.shape)
            ref[f"{name}.V"] = _spec(fac.V.shape)
            if self.var_cor == "simplified":
                ref[f"{name}.S"] = _spec((fac.rank, fac.rank))
        return ref

    def _check_basis(self, _cid: int, content: RecordDict) -> None:
        expect_arrays(content, GRADS, self._basis_grads())

    def _augmented(self) -> dict[str, np.ndarray]:
        out = {}
        for name, fac in self.factors.items():
            k = fac.rank + augmentation_width(fac.rank, fac.U.shape[0], fac.V.shape[0])
            out[f"{name}.S"] = _spec((k, k))
        return out

    def _check_coef(self, _cid: int, content: RecordDict) -> None:
        expect_arrays(content, GRADS, self._augmented())

    def _check_train(self, _cid: int, content: RecordDict) -> None:
        ref = {k: np.zeros(v.shape, v.dtype) for k, v in self.dense.items()}
        expect_arrays(content, protocol.ARRAYS, {**ref, **self._augmented()})

    # ---- accounting ----------------------------------------------------------------------
    def formula_bytes(self) -> dict[str, float]:
        """`round_floats` × 4 bytes per client for a round at the current ranks, and what
        FedAvg / FedLin would send for the same model."""
        dense = sum(self.dense[k].size for k in self.dense)
        full = dense + sum(fac.U.shape[0] * fac.V.shape[0] for fac in self.factors.values())
        floats = (4 if self.dense_correction else 2) * dense
        for fac in self.factors.values():
            counts = round_floats(fac.U.shape[0], fac.V.shape[0], fac.rank, self.var_cor)
            floats += counts["down"] + counts["up"]
        return {
            "bytes-formula": 4.0 * floats,
            "bytes-fedavg": 4.0 * 2 * full,
            "bytes-fedlin": 4.0 * 4 * full,
        }

    # ---- evaluation ----------------------------------------------------------------------
    def finalize(self, fed: Federation) -> dict[str, float]:
        arrays = protocol.to_record(self.global_arrays())
        return final_evaluation(
            fed,
            lambda c, new: protocol.instruction(
                fed.server_round, "evaluate", {protocol.UNSEEN: new}, arrays=arrays
            ),
        )

    def server_evaluate(self) -> dict[str, float]:
        return self._evaluator(self.global_arrays())


class FedLin(FeDLRT):
    """FedLin: every client corrects its local gradients by G − G_c, G the average full
    gradient at the round's start point (two phases per round, nothing factorized)."""

    basis_phase = contract.FEDLIN_GRAD
    train_phase = contract.FEDLIN_TRAIN

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.var_cor = "full"
        self.dense_correction = True

    def layer_names(self) -> list[str]:
        return []


def _load_low_rank(model: Any, weights: Mapping[str, np.ndarray]) -> Any:
    return load_low_rank(model, weights)
