"""FedEM's next-character model for Shakespeare (`NextCharacterLSTM` in the reference code)."""

from __future__ import annotations

import torch
from torch import nn


class NextCharacterLSTM(nn.Module):
    """Embedding(V, 8) -> 2-layer LSTM(256, batch_first) -> Linear(256, V) at every position.

    Input: token ids (batch, seq_len), int64. Output: logits (batch, V, seq_len) — classes on
    dim 1 so that cross-entropy takes the (batch, seq_len) next-character targets directly.
    The vocabulary V is the number of classes (the reference's 100 printable characters): the
    model predicts the next token from the same alphabet it reads. With V = 100 it has 825,220
    parameters. The LSTM takes any sequence length; input_shape = (seq_len,) only documents the
    length the data uses.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        embed_size: int = 8,
        hidden_size: int = 256,
        num_layers: int = 2,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1 or input_shape[0] < 1:
            raise ValueError(
                f"model 'char-lstm' needs token sequences of shape (seq_len,), got {input_shape}"
            )
        if num_classes < 2:
            raise ValueError(
                f"model 'char-lstm' needs a vocabulary of at least 2, got {num_classes}"
            )
        self.encoder = nn.Embedding(num_classes, embed_size)
        self.rnn = nn.LSTM(embed_size, hidden_size, num_layers=num_layers, batch_first=True)
        self.decoder = nn.Linear(hidden_size, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.encoder(tokens))
        logits: torch.Tensor = self.decoder(hidden)
        return logits.permute(0, 2, 1)
