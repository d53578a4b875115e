"""Encoded media, one file at a time: probe it, pick its streams, decode a clip, encode
H.264 and FLAC (and the mp4, WAV and PNG files made of a model's samples)."""
