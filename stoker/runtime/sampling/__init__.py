"""Generated samples: clips drawn from a model by seed (draw), the built-in models'
samplers (flow: the av_dit's ODE; autoregressive: the audio_ar's tokens), the files they
become (mp4, wav, contact sheet), and `stoker sample`'s model rebuilt from a checkpoint.
The trainer's samples during training are stoker/runtime/train_samples.py."""
