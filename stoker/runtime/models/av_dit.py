"""The audio-video diffusion transformer (av_dit), trained with flow matching.

Sequence: video is cut into spatiotemporal patches (pt, ph, pw) and audio
into waveform patches of p samples (all channels in one token); each patch is
linearly embedded to `dim` and gets a learned modality embedding; the model
sees one joint sequence [video tokens, audio tokens] with bidirectional
attention. Either modality may be absent (a data set without it).

Positions: 3D RoPE (t, h, w) for video tokens; audio tokens take the t of
their start time in video-token time units and h = w = 0 (see
`av_rope_tables`). Conditioning: adaLN-zero (DiT) on the timestep, plus a caption's
or class label's vector where model.args.condition asks (conditioning.py). Norms are
RMSNorm, the MLP SwiGLU, with RMSNorm on q and k per head.

Loss: rectified flow (SD3). Per sample t ~ logit-normal(0, 1), noise
eps ~ N(0, I), x in [-1, 1] (video: uint8 / 127.5 - 1; audio as given),
x_t = (1 - t) x + t eps; the model predicts the velocity v = eps - x. A sample's
loss is the mean squared error of v over each modality's values, summed over the
modalities: each modality weighs 1 whatever its token count, so the 40 audio
tokens of a 1 s clip count as much as its 256 video tokens. The batch's loss is
the mean over its valid rows (stoker.model.valid_mean: a row standing in for a
skipped sample adds nothing). At initialisation the model predicts v = 0 exactly
(adaLN-zero and a zero output layer), so the first loss is E|eps - x|^2 = 1 + E[x^2]
per modality.

What the network outputs (`model.args.prediction`): "velocity", v itself (SD3), or
"data", the clean tokens x^ (JiT, Li & He 2025), turned into v = (x_t - x^) / t (t held
at MIN_DATA_T or more) so the loss and the sampler are the same. Predicting data
suits patches wider than the model (the tiny preset's 384-value video patches on a
128-wide model; wider patches still): clean patches lie near a low-dimensional set the
narrow output layer can reach, while noise does not. `model.args.time_shift` s moves
training's t and the sampler's grid toward the noise, t' = s t / (1 + (s - 1) t) (SD3's
shift; 1: none): large patches hold much signal, so more steps go to high noise, where
a sample's layout is decided. `model.args.loss`: the space the squared error is taken in,
"velocity" (v's, the default) or "data" (x's: v's times t^2, t held as above): the
velocity loss weighs the low-noise steps by 1/t^2, the fine detail; the data loss weighs
every t alike, which puts a short training's effort on a clip's layout.

Shapes: the model is built for the largest clip of the data (with data.buckets, the
largest of each dimension over the buckets) and takes any clip that fits in it and
divides into its patches: a smaller clip's RoPE rows are a subset of the largest
one's (positions are integer grid coordinates), so one table serves every bucket.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal, TypeVar, get_args

import torch
import torch.nn.functional as F
from torch import nn

from stoker.kernels import AdaLNRMSNorm, RMSNorm, SwiGLU, rope_table_1d, rope_table_3d
from stoker.kernels.rope import default_sections
from stoker.model import context_parallel, cp_sum, token_slice, valid_mean
from stoker.runtime.models.attention import SelfAttention
from stoker.runtime.models.conditioning import ConditionArgs, Conditioner
from stoker.runtime.models.patches import patchify_audio, patchify_video
from stoker.runtime.models.sizes import AVDiTSize
from stoker.runtime.models.training_model import Batch, Noise, TrainingModel, normal_init_

VIDEO_CHANNELS = 3
TIMESTEP_FREQUENCIES = 256
"""Width of the sinusoidal timestep embedding (DiT's frequency_embedding_size)."""
TIMESTEP_SCALE = 1000.0
"""t in [0, 1] is embedded as t * 1000, the range DiT's frequencies were chosen for."""
Prediction = Literal["velocity", "data"]
PREDICTIONS: tuple[Prediction, ...] = get_args(Prediction)
"""What the network outputs, and the space its loss is taken in (model.args.loss)."""
MIN_DATA_T = 0.05
"""A data-predicting model's v = (x_t - x^) / t divides by t held at this or more: near
t = 0 the quotient would amplify x^'s error without bound (JiT's clip)."""
Time = TypeVar("Time", float, torch.Tensor)


def shift_time(t: Time, shift: float) -> Time:
    """SD3's timestep shift, t' = s t / (1 + (s - 1) t): 0 and 1 stay, the rest moves
    toward 1 (more noise) for s > 1; s = 1 is the identity."""
    if shift == 1.0:
        return t
    return shift * t / (1 + (shift - 1) * t)


def _randn(shape: tuple[int, ...], device: torch.device, generator: Noise) -> torch.Tensor:
    """Standard normal noise of `shape` from one generator, or one row per
    sample from each sample's generator."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.randn(shape, device=device, generator=generator)
    if len(generator) != shape[0]:
        raise ValueError(f"{len(generator)} generators for a batch of {shape[0]} samples")
    return torch.stack([torch.randn(shape[1:], device=device, generator=g) for g in generator])


def timestep_embedding(t: torch.Tensor, width: int = TIMESTEP_FREQUENCIES) -> torch.Tensor:
    """[B] timesteps in [0, 1] -> [B, width] fp32 sinusoids (cos half, sin half)."""
    half = width // 2
    freqs = torch.exp(
        -math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half
    )
    angles = (t.float() * TIMESTEP_SCALE)[:, None] * freqs[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


def av_rope_tables(
    head_dim: int,
    video_grid: tuple[int, int, int] | None,
    audio_tokens: int,
    audio_token_period: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (cos, sin) [S, head_dim / 2] on the CPU for [video tokens, audio tokens].

    Video: rope_table_3d over the (T/pt, H/ph, W/pw) grid. Audio token j starts
    at j * audio_token_period in video-token time units (j * p * fps / (sr * pt));
    its t section is that fractional t and its h and w sections angle 0. So an
    audio token and the video tokens of the same moment share their t angle:
    attention sees their time difference the way it sees two frames'.
    Without video, audio tokens take plain 1D RoPE over their index, all pairs."""
    with torch.device("cpu"):  # not meta, when the model is built on meta
        cos: list[torch.Tensor] = []
        sin: list[torch.Tensor] = []
        if video_grid is not None:
            c, s = rope_table_3d(video_grid, head_dim)
            cos.append(c)
            sin.append(s)
        if audio_tokens and video_grid is None:
            c, s = rope_table_1d(audio_tokens, head_dim)
            cos.append(c)
            sin.append(s)
        elif audio_tokens:
            pairs_t, pairs_h, pairs_w = default_sections(head_dim)
            t = torch.arange(audio_tokens, dtype=torch.float64) * audio_token_period
            zero = torch.zeros(audio_tokens, dtype=torch.float64)
            sections = [
                rope_table_1d(t, 2 * pairs_t),
                rope_table_1d(zero, 2 * pairs_h),
                rope_table_1d(zero, 2 * pairs_w),
            ]
            cos.append(torch.cat([c for c, _ in sections], dim=1))
            sin.append(torch.cat([s for _, s in sections], dim=1))
        return torch.cat(cos), torch.cat(sin)


class TimestepEmbedder(nn.Module):
    """t -> sinusoids -> Linear -> SiLU -> Linear: the conditioning vector c."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(TIMESTEP_FREQUENCIES, dim)
        self.fc2 = nn.Linear(dim, dim)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        # In the weights' dtype: bf16 weights without autocast (FSDP2's param_dtype).
        sinusoids = timestep_embedding(t).to(self.fc1.weight.dtype)
        out: torch.Tensor = self.fc2(F.silu(self.fc1(sinusoids)))
        return out


class DiTBlock(nn.Module):
    """adaLN-zero block: x += gate * attn(norm(x) * (1 + scale) + shift), then
    the same with the MLP; shift / scale / gate come from the conditioning, one
    vector per sample, and are zero at initialisation (the block is the identity)."""

    def __init__(self, dim: int, heads: int, mlp_hidden: int) -> None:
        super().__init__()
        self.modulation = nn.Linear(dim, 6 * dim)
        self.attn_norm = AdaLNRMSNorm(dim)
        self.attn = SelfAttention(dim, heads, causal=False, qk_norm=True)
        self.mlp_norm = AdaLNRMSNorm(dim)
        self.mlp = SwiGLU(dim, mlp_hidden)

    def forward(
        self, x: torch.Tensor, cond: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """x [B, S, dim]; cond [B, dim], the SiLU of the conditioning vector."""
        # One dtype for the norm kernel's x, scale and shift (autocast makes the
        # modulation bf16 while the residual stream stays fp32).
        mod = self.modulation(cond).to(x.dtype)
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mod.chunk(6, dim=-1)
        x = x + gate_a[:, None] * self.attn(self.attn_norm(x, scale_a, shift_a), cos, sin)
        x = x + gate_m[:, None] * self.mlp(self.mlp_norm(x, scale_m, shift_m))
        return x


class AVDiT(TrainingModel):
    """The audio-video DiT for the clips of one data config.

    video: the largest (frames, height, width) of a clip, or None without video;
    audio: (channels, the most samples), or None without audio; fps and sample_rate
    place audio tokens in time against the video tokens. A batch may hold any clip
    that fits in these and divides into the patches (data.buckets)."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(
        self,
        size: AVDiTSize,
        *,
        video: tuple[int, int, int] | None,
        audio: tuple[int, int] | None,
        fps: float,
        sample_rate: float,
        video_channels: int = VIDEO_CHANNELS,
        latent: bool = False,
        prediction: Prediction = "velocity",
        time_shift: float = 1.0,
        loss: Prediction = "velocity",
    ) -> None:
        super().__init__()
        if video is None and audio is None:
            raise ValueError("an av_dit needs video, audio or both; it was given neither")
        for name, value in (("prediction", prediction), ("loss", loss)):
            if value not in PREDICTIONS:
                raise ValueError(f"{name} {value!r} is not one of {', '.join(PREDICTIONS)}")
        if not (math.isfinite(time_shift) and time_shift > 0):
            raise ValueError(f"time_shift {time_shift!r} must be a number above 0 (1: none)")
        self.prediction: Prediction = prediction
        self.loss_space: Prediction = loss
        self.time_shift = float(time_shift)
        self.size, self.video, self.audio = size, video, audio
        # On latents (`stoker data encode`): batch["latent"]["video"] [B, T, C, h, w] and
        # ["audio"] [B, A, n] as the encoder gave them, not scaled from uint8; `fps` and
        # `sample_rate` are then the latents' frames per second along each time axis.
        self.latent, self.video_channels = latent, video_channels
        dim = size.dim
        pt, ph, pw = size.video_patch
        self.video_grid: tuple[int, int, int] | None = None
        self.video_tokens = self.audio_tokens = 0
        if video is not None:
            frames, height, width = video
            if frames % pt or height % ph or width % pw:
                raise ValueError(
                    f"video {video} (frames, height, width) does not divide into patches "
                    f"{size.video_patch}"
                )
            self.video_grid = (frames // pt, height // ph, width // pw)
            self.video_tokens = math.prod(self.video_grid)
            self.video_embed = nn.Linear(pt * ph * pw * video_channels, dim)
            self.video_out = nn.Linear(dim, pt * ph * pw * video_channels)
            self.video_modality = nn.Parameter(torch.zeros(dim))
        if audio is not None:
            channels, samples = audio
            if samples % size.audio_patch:
                raise ValueError(
                    f"audio of {samples} samples does not divide into patches of {size.audio_patch}"
                )
            self.audio_tokens = samples // size.audio_patch
            self.audio_embed = nn.Linear(channels * size.audio_patch, dim)
            self.audio_out = nn.Linear(dim, channels * size.audio_patch)
            self.audio_modality = nn.Parameter(torch.zeros(dim))
        # Audio token j starts at sample j * p: time j * p / sr s, frame j * p * fps / sr.
        self.audio_token_period = size.audio_patch * fps / (sample_rate * pt)

        self.t_embed = TimestepEmbedder(dim)
        self.blocks = nn.ModuleList(
            DiTBlock(dim, size.heads, size.mlp_hidden) for _ in range(size.depth)
        )
        self.final_modulation = nn.Linear(dim, 2 * dim)
        self.final_norm = AdaLNRMSNorm(dim)
        self.conditioner: Conditioner | None = None  # set_condition
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.init_weights()

        matmuls: list[tuple[nn.Linear, str]] = [
            (self.t_embed.fc1, "sample"),
            (self.t_embed.fc2, "sample"),
            (self.final_modulation, "sample"),
        ]
        for block in self.blocks:
            assert isinstance(block, DiTBlock)
            matmuls += [(block.modulation, "sample"), (block.attn.qkv, "tokens")]
            matmuls += [(block.attn.out, "tokens"), (block.mlp.w_in, "tokens")]
            matmuls += [(block.mlp.w_out, "tokens")]
        for name in self.modalities:
            matmuls += [(getattr(self, f"{name}_{layer}"), name) for layer in ("embed", "out")]
        counts = {"sample": 1, "video": self.video_tokens, "audio": self.audio_tokens}
        self._count_flops(matmuls, dim, {**counts, "tokens": self.video_tokens + self.audio_tokens})

    def set_condition(self, args: ConditionArgs) -> None:
        """Condition the model on captions or class labels (conditioning.py); made after
        the rest, so an unconditioned model's initial weights do not change."""
        if args.condition == "none":
            self.conditioner = None
            return
        self.conditioner = Conditioner(args, self.size.dim).to(self.final_modulation.weight.device)
        self.conditioner.init_weights()

    @property
    def modalities(self) -> tuple[str, ...]:
        return (("video",) if self.video else ()) + (("audio",) if self.audio else ())

    def init_weights(self) -> None:
        """DiT's initialisation: xavier-uniform linears, zero biases; zero
        adaLN modulation and output layers (adaLN-zero); RoPE tables rebuilt."""
        device = self.final_modulation.weight.device
        cos, sin = av_rope_tables(
            self.size.dim // self.size.heads,
            self.video_grid,
            self.audio_tokens,
            self.audio_token_period,
        )
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.xavier_uniform_(module.weight)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
                elif isinstance(module, RMSNorm) and module.weight is not None:
                    nn.init.ones_(module.weight)
            for linear in (self.t_embed.fc1, self.t_embed.fc2):
                normal_init_(linear.weight, std=0.02)
            zeroed = [self.final_modulation, *self._output_layers()]
            # Walk modules rather than self.blocks: the runtime may have wrapped
            # the blocks (checkpointing, compile) before calling this.
            zeroed += [m.modulation for m in self.modules() if isinstance(m, DiTBlock)]
            for linear in zeroed:
                nn.init.zeros_(linear.weight)
                nn.init.zeros_(linear.bias)
            for name in self.modalities:
                normal_init_(getattr(self, f"{name}_modality"), std=0.02)
        if getattr(self, "conditioner", None) is not None:
            self.conditioner.init_weights()  # type: ignore[union-attr]

    def _output_layers(self) -> list[nn.Linear]:
        return [getattr(self, f"{name}_out") for name in self.modalities]

    def inputs(self, batch: Batch) -> Mapping[str, torch.Tensor]:
        """The batch's clips by modality: its "video" and "audio", or on latents the
        tensors of its "latent" of those names."""
        if not self.latent:
            return batch
        latent = batch.get("latent")
        missing = [n for n in self.modalities if not isinstance(latent, Mapping) or n not in latent]
        if missing:
            has = sorted(latent) if isinstance(latent, Mapping) else "no 'latent'"
            raise ValueError(
                f"this av_dit trains on latents named {list(self.modalities)}, but the batch "
                f"has {has}: train it on a data set `stoker data encode` wrote with an encoder "
                "that returns 'video' and/or 'audio' (data.modalities: [latent])"
            )
        assert isinstance(latent, Mapping)
        return latent

    def _check_modalities(self, batch: Batch) -> None:
        if self.latent:
            self.inputs(batch)
            return
        missing = [name for name in self.modalities if name not in batch]
        if missing:
            raise ValueError(
                f"the batch has {sorted(batch)} but this av_dit was built for "
                f"{list(self.modalities)} (data.modalities) and lacks {missing}; build the "
                "model from the same data config as the loader"
            )

    def video_grid_of(self, video: torch.Tensor) -> tuple[int, int, int]:
        """The (T/pt, H/ph, W/pw) patch grid of a [B, T, C, H, W] video (C = 3, or the
        latents' channels); a ValueError for a clip that is larger than the model's or
        does not divide into patches."""
        assert self.video is not None
        patch, shape = self.size.video_patch, tuple(video.shape)
        sizes = (shape[1], shape[3], shape[4]) if len(shape) == 5 else (0, 0, 0)
        fits = zip(sizes, self.video, patch, strict=True)
        if shape[2:3] != (self.video_channels,) or not all(
            0 < n <= most and n % p == 0 for n, most, p in fits
        ):
            (frames, height, width), (pt, ph, pw) = self.video, patch
            name = "batch['latent']['video']" if self.latent else "batch['video']"
            channels = self.video_channels
            raise ValueError(
                f"{name} has shape {shape}; this av_dit takes [B, T, {channels}, H, W] with "
                f"T a multiple of {pt} up to {frames}, H of {ph} up to {height} and W of {pw} "
                f"up to {width} (data.clip_seconds x data.fps, data.resolution, data.buckets)"
            )
        return (sizes[0] // patch[0], sizes[1] // patch[1], sizes[2] // patch[2])

    def audio_tokens_of(self, audio: torch.Tensor) -> int:
        """Audio tokens of a [B, C, N] clip; a ValueError for one longer than the
        model's, of other channels, or not a multiple of the patch."""
        assert self.audio is not None
        (channels, samples), patch, shape = self.audio, self.size.audio_patch, tuple(audio.shape)
        fits = len(shape) == 3 and shape[1] == channels and 0 < shape[2] <= samples
        if not fits or shape[2] % patch:
            name = "batch['latent']['audio']" if self.latent else "batch['audio']"
            raise ValueError(
                f"{name} has shape {shape}; this av_dit takes [B, {channels}, N] with "
                f"N a multiple of {patch} up to {samples} (data.channels, data.clip_seconds x "
                "data.sample_rate, data.buckets)"
            )
        return shape[2] // patch

    def token_counts(self, batch: Batch) -> dict[str, int]:
        """Video, audio and all tokens of one sample of this batch's shape."""
        self._check_modalities(batch)
        clips = self.inputs(batch)
        video = math.prod(self.video_grid_of(clips["video"])) if self.video is not None else 0
        audio = self.audio_tokens_of(clips["audio"]) if self.audio is not None else 0
        return {"tokens": video + audio, "video": video, "audio": audio}

    def clean_tokens(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The batch as fp32 patch tokens in [-1, 1], per modality."""
        self._check_modalities(batch)
        clips = self.inputs(batch)
        tokens = {}
        if self.video is not None:
            video = clips["video"]
            self.video_grid_of(video)
            scaled = video.float() if self.latent else video.float() / 127.5 - 1.0
            tokens["video"] = patchify_video(scaled, self.size.video_patch)
        if self.audio is not None:
            audio = clips["audio"]
            self.audio_tokens_of(audio)
            tokens["audio"] = patchify_audio(audio.float(), self.size.audio_patch)
        return tokens

    def rope(
        self, grid: tuple[int, int, int] | None, audio_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) for a clip of `grid` video patches and `audio_tokens` audio
        tokens: the rows of the largest clip's tables at its positions."""
        if grid == self.video_grid and audio_tokens == self.audio_tokens:
            return self.rope_cos, self.rope_sin
        return (
            self._rope_rows(self.rope_cos, grid, audio_tokens),
            self._rope_rows(self.rope_sin, grid, audio_tokens),
        )

    def _rope_rows(
        self, table: torch.Tensor, grid: tuple[int, int, int] | None, audio_tokens: int
    ) -> torch.Tensor:
        parts = []
        if self.video_grid is not None and grid is not None:
            # Video rows are t-major, then h, then w (rope_table_3d): a sub-box of the grid.
            box = table[: self.video_tokens].view(*self.video_grid, table.shape[-1])
            parts.append(box[: grid[0], : grid[1], : grid[2]].reshape(-1, table.shape[-1]))
        if audio_tokens:  # audio token j's angles depend on j only: a prefix
            parts.append(table[self.video_tokens : self.video_tokens + audio_tokens])
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def velocity(
        self,
        x_t: dict[str, torch.Tensor],
        t: torch.Tensor,
        grid: tuple[int, int, int] | None = None,
        conditions: Sequence[str | None] | None = None,
        shares: Mapping[str, slice] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Predicted v per modality, in the tokens' layout, for noisy tokens at t [B].
        `grid`: the video's patch grid (video_grid_of); None: the largest clip's.
        `conditions`: a conditioned model's caption or class label per sample, None
        for none (its null vector); all None when not given. `shares`: with context
        parallelism, which of each modality's tokens x_t holds (stoker.model.token_slice
        of its whole count); None: all of them."""
        parts = []
        for name in self.modalities:
            embed: nn.Linear = getattr(self, f"{name}_embed")
            tokens = x_t[name].to(embed.weight.dtype)
            parts.append(embed(tokens) + getattr(self, f"{name}_modality"))
        x = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        video_tokens = x_t["video"].shape[1] if self.video is not None else 0
        counts = {name: x_t[name].shape[1] for name in self.modalities}
        cp = context_parallel()
        if shares is not None and cp is not None:  # the whole sequence's, from this share
            counts = {name: count * cp.size for name, count in counts.items()}
        grid = grid or self.video_grid
        if grid is not None and math.prod(grid) != counts.get("video", 0):
            raise ValueError(
                f"{counts.get('video', 0)} video tokens do not make the patch grid {grid}"
            )
        cos, sin = self.rope(grid, counts.get("audio", 0))
        if shares is not None:  # the rows of this rank's tokens: its video's, its audio's
            positions = torch.arange(cos.shape[0], device=cos.device)
            whole_video = counts.get("video", 0)
            by_modality = {"video": positions[:whole_video], "audio": positions[whole_video:]}
            picked = torch.cat([by_modality[name][shares[name]] for name in self.modalities])
            cos, sin = cos[picked], sin[picked]
        embedded = self.t_embed(t)
        if self.conditioner is not None:
            rows = list(conditions) if conditions is not None else [None] * t.shape[0]
            embedded = embedded + self.conditioner(rows).to(embedded.dtype)
        elif conditions is not None and any(c is not None for c in conditions):
            raise ValueError(
                "conditions given to an av_dit trained without any (model.args.condition)"
            )
        cond = F.silu(embedded)
        for block in self.blocks:
            x = block(x, cond, cos, sin)
        shift, scale = self.final_modulation(cond).to(x.dtype).chunk(2, dim=-1)
        x = self.final_norm(x, scale, shift)
        out = {}
        if self.video is not None:
            out["video"] = self.video_out(x[:, :video_tokens])
        if self.audio is not None:
            out["audio"] = self.audio_out(x[:, video_tokens:])
        if self.prediction == "data":  # the output is x^: v = (x_t - x^) / t, in fp32
            held = t.float().clamp(min=MIN_DATA_T)[:, None, None]
            out = {name: (x_t[name].float() - clean.float()) / held for name, clean in out.items()}
        return out

    def noised(
        self, clean: dict[str, torch.Tensor], generator: Noise = None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, torch.Tensor]]:
        """(x_t, t, v): noisy tokens, timesteps [B] ~ logit-normal(0, 1) (then shifted
        by time_shift) and the velocity targets eps - x, drawing t first, then each
        modality's noise.
        `generator`: one for the batch, or one per sample (then a sample's
        noise depends on its own generator only, not on the batch it is in)."""
        first = next(iter(clean.values()))
        size, device = first.shape[0], first.device
        t = shift_time(torch.sigmoid(_randn((size,), device, generator)), self.time_shift)
        weight = t[:, None, None]
        x_t, target = {}, {}
        for name, x in clean.items():
            noise = _randn(tuple(x.shape), device, generator)
            x_t[name] = (1 - weight) * x + weight * noise
            target[name] = noise - x
        return x_t, t, target

    def forward(self, batch: Batch, generator: Noise = None) -> torch.Tensor:
        """The flow-matching loss of a batch, its valid rows' mean (see the module
        docstring); the noise from `generator`, else the batch's per-sample
        "generators" (stoker/model.py)."""
        if generator is None:
            generator = batch.get("generators")
        clean = self.clean_tokens(batch)
        grid = self.video_grid_of(self.inputs(batch)["video"]) if self.video is not None else None
        x_t, t, target = self.noised(clean, generator)
        conditions = None
        if self.conditioner is not None:  # drawn after the noise: its draws stay as they were
            conditions = self.conditioner.dropped(self.conditioner.labels(batch), generator)
        if context_parallel() is None:
            predicted = self.velocity(x_t, t, grid, conditions)
            per_sample = [
                (predicted[name].float() - target[name]).square().mean(dim=(1, 2))
                for name in self.modalities
            ]
            return valid_mean(torch.stack(per_sample).sum(dim=0) * self._weight(t), batch)
        # Context parallelism: this rank's share of each modality's tokens, cut after
        # the noise was drawn for the whole sample; each modality's squared errors summed
        # over every rank's share and divided by the whole count: CP 1's loss.
        shares = {name: token_slice(x.shape[1]) for name, x in x_t.items()}
        counts = {name: x[0].numel() for name, x in x_t.items()}
        x_t = {name: x[:, shares[name]] for name, x in x_t.items()}
        predicted = self.velocity(x_t, t, grid, conditions, shares)
        per_sample = [
            cp_sum(
                (predicted[name].float() - target[name][:, shares[name]]).square().sum(dim=(1, 2))
            )
            / counts[name]
            for name in self.modalities
        ]
        return valid_mean(torch.stack(per_sample).sum(dim=0) * self._weight(t), batch)

    def _weight(self, t: torch.Tensor) -> torch.Tensor | float:
        """Each sample's weight on v's squared error [B]: t^2 (t held at MIN_DATA_T or
        more) for a loss in data space, where x - x^ = t (v - v^); 1 in v's."""
        if self.loss_space == "velocity":
            return 1.0
        return t.float().clamp(min=MIN_DATA_T).square()
