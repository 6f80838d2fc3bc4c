"""The FLOP counts behind docs/recipes.md's GPU-hour estimates."""

from __future__ import annotations

import torch
from torch import nn

from experiments.recipe_flops import char_lstm_flops, forward_flops
from models import build_model


def test_a_linear_layer_counts_two_flops_per_multiply_add() -> None:
    assert forward_flops(nn.Linear(30, 7), torch.zeros(1, 30)) == 2 * 30 * 7


def test_the_char_lstm_count_is_its_gates_and_decoder_per_token() -> None:
    model = build_model("char-lstm", (80,), 100)
    per_token_decoder = 2 * 256 * 100
    # the counter sees the decoder but not the LSTM recurrence; the written-out count adds it
    counted = forward_flops(model, torch.zeros(1, 80, dtype=torch.long))
    assert counted == 80 * per_token_decoder
    gates = 2 * 4 * ((8 + 256) * 256 + (256 + 256) * 256)
    assert char_lstm_flops() == 80 * (gates + per_token_decoder)
