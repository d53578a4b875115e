"""The autoregressive audio model (audio_ar): a decoder-only transformer over
8-bit mu-law audio samples, one token per sample (WaveNet's tokens, a
transformer's architecture).

Input: audio [B, C, N] -> mono (mean over channels) -> the first S samples,
S = min(the preset's max_tokens, N) (1024 tokens, 64 ms at 16 kHz, for tiny:
the loader already picks a random clip, this takes its start) -> mu-law codes
0..255. The model reads [BOS, c_0 .. c_{S-2}] and predicts c_0 .. c_{S-1}. S is
the batch's own: a shorter bucket (data.buckets) gives a shorter sequence, not
padding. A sample's loss is its mean cross-entropy; the batch's, the mean over its
valid rows (stoker.model.valid_mean: a row standing in for a skipped sample adds
nothing).

Blocks are pre-norm with the residual add fused into each norm
(stoker.kernels.AddRMSNorm): a block takes (x, residual), the previous
sublayer's output and the stream before it, and returns its MLP's output and
the stream; block 0 gets a zero stream, so every block is alike (one compiled
graph). 1D RoPE, causal attention, SwiGLU, an untied 256-way head, and
cross-entropy (stoker.kernels.cross_entropy) on next-sample targets.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from stoker.kernels import AddRMSNorm, SwiGLU, cross_entropy, rope_table_1d
from stoker.model import context_parallel, cp_sum, token_slice, valid_mean
from stoker.runtime.models.attention import SelfAttention
from stoker.runtime.models.mu_law import CLASSES, mu_law_encode
from stoker.runtime.models.sizes import AudioARSize
from stoker.runtime.models.training_model import Batch, Noise, TrainingModel, normal_init_

BOS = CLASSES
"""The start token, one past the 256 mu-law codes; the head never predicts it."""


class ARBlock(nn.Module):
    """Pre-norm block with fused residual adds: (x, residual) -> (mlp out, residual)."""

    def __init__(self, dim: int, heads: int, mlp_hidden: int) -> None:
        super().__init__()
        self.attn_norm = AddRMSNorm(dim)
        self.attn = SelfAttention(dim, heads, causal=True, qk_norm=False)
        self.mlp_norm = AddRMSNorm(dim)
        self.mlp = SwiGLU(dim, mlp_hidden)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.attn_norm(x, residual)
        # Back to the stream's dtype: under autocast the sublayers return bf16
        # while the stream stays fp32, and the fused add takes one dtype.
        x = self.attn(h, cos, sin).to(residual.dtype)
        h, residual = self.mlp_norm(x, residual)
        return self.mlp(h).to(residual.dtype), residual


class AudioAR(TrainingModel):
    """Decoder-only transformer over mu-law audio tokens; `samples` is the longest
    clip N of the data (data.clip_seconds x data.sample_rate; with data.buckets, the
    longest bucket's): it fixes the longest sequence and the RoPE table."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, size: AudioARSize, *, samples: int) -> None:
        super().__init__()
        if samples < 2:
            raise ValueError(f"audio of {samples} samples is too short to predict a next sample")
        self.size = size
        self.seq_len = min(size.max_tokens, samples)
        dim = size.dim
        self.embed = nn.Embedding(CLASSES + 1, dim)
        self.blocks = nn.ModuleList(
            ARBlock(dim, size.heads, size.mlp_hidden) for _ in range(size.depth)
        )
        self.final_norm = AddRMSNorm(dim)
        self.head = nn.Linear(dim, CLASSES, bias=False)
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.init_weights()

        matmuls = [(self.head, "tokens")]
        for block in self.blocks:
            assert isinstance(block, ARBlock)
            linears = (block.attn.qkv, block.attn.out, block.mlp.w_in, block.mlp.w_out)
            matmuls += [(linear, "tokens") for linear in linears]
        self._count_flops(matmuls, dim, {"sample": 1, "tokens": self.seq_len})

    def init_weights(self) -> None:
        """GPT-2's initialisation: N(0, 0.02), the projections back into the
        residual stream scaled by 1/sqrt(2 * depth); norms 1; RoPE tables rebuilt."""
        with torch.device("cpu"):  # not meta, when the model is built on meta
            cos, sin = rope_table_1d(self.seq_len, self.size.dim // self.size.heads)
        device = self.head.weight.device
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)
        out_std = 0.02 / math.sqrt(2 * self.size.depth)
        with torch.no_grad():
            normal_init_(self.embed.weight, std=0.02)
            normal_init_(self.head.weight, std=0.02)
            # Walk modules rather than self.blocks: the runtime may have wrapped
            # the blocks (checkpointing, compile) before calling this.
            for module in self.modules():
                if isinstance(module, AddRMSNorm) and module.weight is not None:
                    nn.init.ones_(module.weight)
                elif isinstance(module, ARBlock):
                    normal_init_(module.attn.qkv.weight, std=0.02)
                    normal_init_(module.attn.out.weight, std=out_std)
                    normal_init_(module.mlp.w_in.weight, std=0.02)
                    normal_init_(module.mlp.w_out.weight, std=out_std)

    def sequence_length(self, batch: Batch) -> int:
        """S for this batch: min(the longest sequence, its clips' samples)."""
        if "audio" not in batch:
            raise ValueError(
                f"the batch has {sorted(batch)} but no 'audio'; audio_ar needs "
                "'audio' in data.modalities"
            )
        audio = batch["audio"]
        if audio.dim() != 3 or audio.shape[2] < 1:
            raise ValueError(
                f"batch['audio'] has shape {tuple(audio.shape)}; expected [B, channels, samples]"
            )
        return min(self.seq_len, int(audio.shape[2]))

    def token_counts(self, batch: Batch) -> dict[str, int]:
        return {"tokens": self.sequence_length(batch)}

    def tokens(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each int64 [B, S]: [BOS, c_0 .. c_{S-2}] and
        c_0 .. c_{S-1}."""
        seq = self.sequence_length(batch)
        mono = batch["audio"][:, :, :seq].float().mean(dim=1)
        codes = mu_law_encode(mono)
        bos = torch.full_like(codes[:, :1], BOS)
        return torch.cat((bos, codes[:, :-1]), dim=1), codes

    def logits(self, inputs: torch.Tensor, first: int = 0) -> torch.Tensor:
        """[B, S'] tokens (S' <= S) at positions first .. first + S' - 1 -> [B, S', 256]
        next-token logits (first > 0: a context-parallel rank's share)."""
        seq = inputs.shape[1]
        cos, sin = self.rope_cos[first : first + seq], self.rope_sin[first : first + seq]
        x = self.embed(inputs)
        residual = torch.zeros_like(x)
        for block in self.blocks:
            x, residual = block(x, residual, cos, sin)
        h, _ = self.final_norm(x, residual)
        out: torch.Tensor = self.head(h)
        return out

    def forward(self, batch: Batch, generator: Noise = None) -> torch.Tensor:
        """Next-token cross-entropy (nats): each sample's mean over its tokens, then the
        mean over the valid rows. `generator` is unused: this loss draws no noise."""
        inputs, targets = self.tokens(batch)
        if context_parallel() is None:
            per_token = cross_entropy(self.logits(inputs), targets, reduction="none")
            return valid_mean(per_token.mean(dim=1), batch)
        # Context parallelism (Ulysses: causal attention needs every earlier token, which
        # the all-to-all gathers): this rank's share of the positions; the losses summed
        # over every share and divided by the whole sequence's count.
        share = token_slice(inputs.shape[1])
        logits = self.logits(inputs[:, share], first=share.start)
        per_token = cross_entropy(logits, targets[:, share], reduction="none")
        return valid_mean(cp_sum(per_token.sum(dim=1)) / targets.shape[1], batch)
