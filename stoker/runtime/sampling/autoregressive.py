"""Sampling the audio_ar: mu-law tokens one at a time, then back to a waveform.

The model reads [BOS, c_0 .. c_{k-1}] and gives the logits of c_k (AudioAR.logits);
c_k is drawn from softmax(logits / temperature), kept to the `top_k` likeliest codes
when asked, by that sample's own generator (one draw per token): a sample depends on
its generator only, never on the batch it is drawn in. An optional prompt (a waveform,
mixed to mono and mu-law coded as in training) fixes the first codes; the rest are
drawn up to N, at most the model's longest sequence (its RoPE table).

There is no key-value cache yet: every token reruns the model over the whole prefix,
N calls of up to N tokens, so the cost grows as N^2 (the tiny preset's 1024 samples,
4 at a time, took 247 s on one loaded CPU thread; short clips are what tests can afford).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from stoker.runtime.models.audio_ar import BOS, AudioAR
from stoker.runtime.models.mu_law import CLASSES, mu_law_decode, mu_law_encode


def check_ar_settings(temperature: float, top_k: int | None) -> None:
    """A ValueError naming the bad value: temperature a finite number above 0, top_k
    None or 1..256."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise ValueError(f"temperature {temperature!r} must be a number above 0")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(
            f"temperature {temperature!r} must be a finite number above 0 (1: the model's "
            "own distribution; lower: likelier codes; for the likeliest code, top_k=1)"
        )
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= CLASSES
    ):
        raise ValueError(
            f"top_k {top_k!r} must be None (every code) or a whole number from 1 to {CLASSES}"
        )


def prompt_codes(prompt: torch.Tensor, batch: int, device: torch.device) -> torch.Tensor:
    """int64 [B, P] mu-law codes of a prompt waveform [C, P] (the same for every sample)
    or [B, C, P] (one per sample), mixed to mono as training does."""
    if prompt.dim() == 2:
        prompt = prompt.expand(batch, *prompt.shape)
    if prompt.dim() != 3 or prompt.shape[0] != batch:
        raise ValueError(
            f"prompt has shape {tuple(prompt.shape)}; give audio [C, P] for every sample, "
            f"or [{batch}, C, P], one per sample"
        )
    return mu_law_encode(prompt.to(device).float().mean(dim=1))


def next_codes(
    logits: torch.Tensor,
    generators: Sequence[torch.Generator],
    temperature: float,
    top_k: int | None,
) -> torch.Tensor:
    """int64 [B] codes drawn from [B, 256] logits, row b by generators[b]."""
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kept, index = logits.topk(top_k, dim=-1)
        # Exactly k codes stay, ties at the k-th included or not by topk's choice.
        logits = torch.full_like(logits, -math.inf).scatter(-1, index, kept)
    probs = logits.softmax(dim=-1)
    return torch.cat(
        [torch.multinomial(row, 1, generator=g) for row, g in zip(probs, generators, strict=True)]
    )


@torch.no_grad()
def sample_audio_ar(
    model: AudioAR,
    generators: Sequence[torch.Generator],
    *,
    samples: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    prompt: torch.Tensor | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> dict[str, torch.Tensor]:
    """{"audio": float32 [B, 1, N]}: len(generators) waveforms of N = `samples` (None:
    the model's longest sequence) mu-law levels in [-1, 1], one per generator (each on
    the model's device). With a `prompt` ([C, P] or [B, C, P], P < N), each begins with
    the prompt's own P levels. The model is put in eval mode for the duration and back
    in its mode afterwards."""
    check_ar_settings(temperature, top_k)
    if not generators:
        raise ValueError("no generators: give one per sample to draw")
    length = model.seq_len if samples is None else samples
    if not 1 <= length <= model.seq_len:
        raise ValueError(
            f"samples {samples!r} must be from 1 to {model.seq_len}, this audio_ar's longest "
            "sequence (model.size and the data's clip length fix it)"
        )
    device = model.head.weight.device
    for g in generators:
        if g.device != device:
            raise ValueError(
                f"a generator is on {g.device} but the model on {device}: make them with "
                f"torch.Generator(device={str(device)!r})"
            )
    batch = len(generators)
    tokens = torch.full((batch, 1), BOS, dtype=torch.long, device=device)
    if prompt is not None:
        codes = prompt_codes(prompt, batch, device)
        if codes.shape[1] >= length:
            raise ValueError(
                f"the prompt's {codes.shape[1]} samples leave none of the {length} to draw: "
                "give a shorter prompt or more samples"
            )
        tokens = torch.cat((tokens, codes), dim=1)
    was_training = model.training
    model.eval()
    try:
        while tokens.shape[1] <= length:
            logits = model.logits(tokens)[:, -1]
            drawn = next_codes(logits, generators, temperature, top_k)
            tokens = torch.cat((tokens, drawn[:, None]), dim=1)
            if on_step is not None:  # (drawn, to draw): one step a sample
                on_step(tokens.shape[1] - 1, length)
    finally:
        model.train(was_training)
    return {"audio": mu_law_decode(tokens[:, 1:])[:, None]}
