"""Secure aggregation, Flower-runtime-free: what SecAgg+ (Bell, Bonawitz, Gascón, Lepoint and
Raykova, CCS 2020, "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead") needs
on both sides of a round, in NumPy over the vector a client contributes.

  encoding  fixed-point integers modulo a power of two: clipping, stochastic rounding, the
            weight inside the vector, decoding of the sum, the modulus a sum needs
  keys      the cryptography: key pairs derived from a client's secret, key agreement,
            authenticated encryption of the shares, Shamir's t-of-n sharing (Flower's
            `flwr.common.secure_aggregation` and `cryptography`; nothing written by hand)
  masks     the masks: a ChaCha20 key stream from a 256-bit key, as integers modulo 2^b
  graph     who shares with whom: SecAgg+'s random k-regular graph, and the threshold
  noise     integer noise for distributed DP (Skellam: Agarwal, Kairouz and Liu, NeurIPS
            2021), sampled from a client's private generator

The round's phases that use them are the runtime's (server.secagg, client.secagg); the
message layout both halves share is pollen.core.contracts.secagg.
"""
