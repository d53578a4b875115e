"""Synthetic data sets: bouncing shapes with tones that follow them, as media
(`stoker data synth`) or as latents, and the set behind `data.url: null`, made once."""
